"""init(loggers=[...]) against the real packages: files, TensorBoard, wandb offline, MLflow.

One process (no launcher), so the trackers run in this test's process; wandb runs offline
with its telemetry and console capture off, MLflow on a local SQLite store.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import splitsync as ss

WANDB_ENV = {
    "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
    "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_X_DISABLE_STATS": "true",
    "WANDB_X_DISABLE_META": "true", "WANDB_ERROR_REPORTING": "false",
    "WANDB_X_DISABLE_MACHINE_INFO": "true",
}


class Collect(logging.Handler):
    """The splitsync logger's records (it does not propagate to pytest's handlers)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def messages():
    handler = Collect()
    logger = logging.getLogger("splitsync")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def _train(run_dir: Path, loggers: list[str] | None, steps: int = 3) -> list[dict]:
    with ss.init(seed=0, run_dir=str(run_dir), loggers=loggers) as run:
        run.log_config({"lr": 0.01, "model": {"layers": 2, "name": "mlp"}})
        return [run.log(step=s, loss=1.0 / (s + 1), acc=0.5 + 0.1 * s) for s in range(steps)]


def test_unknown_logger_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="'comet'.*jsonl, csv, tensorboard, wandb, mlflow"):
        ss.init(loggers=["jsonl", "comet"])


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'splitsync\[wandb\]'"):
        ss.init(loggers=["wandb"])


def test_file_loggers_need_a_run_dir() -> None:
    with ss.init(loggers=["csv"]) as run, pytest.raises(ValueError, match="run_dir"):
        run.log(loss=1.0)


def test_default_is_unchanged_and_config_recorded(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _train(tmp_path, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json", "metrics.csv", "metrics.jsonl", "tensorboard"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["lr"] == 0.01 and config["model.layers"] == 2
    assert config["splitsync.world_size"] == 1 and config["splitsync.seed"] == 0
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("loss")] == [
        (0, 1.0), (1, 0.5), (2, 0.3333)]
    assert "_hparams_/experiment" in events.Tags()["tensors"] or any(
        "hparams" in t for t in events.summary_metadata)


@pytest.mark.slow  # wandb's service process, then its reader in another
def test_wandb_offline_gets_config_and_every_step(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    for key, value in WANDB_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    _train(tmp_path, ["wandb"])
    logs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1, list(tmp_path.rglob("*"))
    # wandb's own reader of its offline transaction log
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json",
                          str(logs[0])], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    history = [r["history"] for r in records if r["type"] == "history"]
    assert [h["step"].get("num", 0) for h in history] == [0, 1, 2]
    assert [h["item"]["loss"] for h in history] == pytest.approx([1.0, 0.5, 1 / 3])
    config: dict = {}
    for r in records:
        if r["type"] == "config":
            config.update(r["config"]["update"])
    assert config["lr"] == 0.01 and config["model.layers"] == 2
    assert config["splitsync.strategy"] == "auto"


def test_wandb_dir_setting_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    for key, value in WANDB_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    _train(tmp_path / "run", ["wandb"], steps=1)
    assert list((tmp_path / "elsewhere" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert not (tmp_path / "run" / "wandb").exists()


def _mlflow_runs(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("splitsync")
    return client, client.search_runs([experiment.experiment_id])


@pytest.mark.slow  # a real mlflow store (sqlite, its migrations): seconds of setup
def test_mlflow_run_params_and_metrics_read_back(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _train(tmp_path, ["mlflow"])
    client, runs = _mlflow_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    params = runs[0].data.params
    assert params["lr"] == "0.01" and params["model.name"] == "mlp"
    assert params["splitsync.precision"] == "32"
    history = client.get_metric_history(runs[0].info.run_id, "loss")
    assert sorted((m.step, round(m.value, 4)) for m in history) == [
        (0, 1.0), (1, 0.5), (2, 0.3333)]
    assert not (tmp_path / "metrics.jsonl").exists()  # only the chosen tracker


@pytest.mark.slow  # a real mlflow store, as above
def test_tracker_failing_mid_run_is_reported_once(tmp_path: Path, messages: list[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the user's setting wins over run_dir
    run_dir = tmp_path / "run"
    with ss.init(seed=0, run_dir=str(run_dir), loggers=["jsonl", "csv", "mlflow"]) as run:
        run.log(step=0, loss=1.0)
        for p in run_dir.iterdir():
            p.unlink()
        run_dir.rmdir()
        run_dir.write_text("not a directory any more")
        records = [run.log(step=s, loss=float(s)) for s in range(1, 4)]
    assert [r["loss"] for r in records] == [1.0, 2.0, 3.0]  # training went on
    failed = [m for m in messages if "failed" in m]
    assert len(failed) == 2, messages  # jsonl and csv, once each
    assert any("'jsonl'" in m for m in failed) and any("'csv'" in m for m in failed)
    assert all("turned off" in m for m in failed)
    client, runs = _mlflow_runs(uri)
    history = client.get_metric_history(runs[0].info.run_id, "loss")
    assert sorted(m.step for m in history) == [0, 1, 2, 3]  # the healthy tracker kept going
