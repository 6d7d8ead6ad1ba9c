"""run.log on two real gloo ranks: averaged, printed once, written once (rank 0).

run.progress rides along: plain lines on rank 0, silence on rank 1.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import pytest

from splitsync.testing import spawn


def _log_rank(rank: int, world_size: int, run_dir: str) -> tuple[list[dict], str, list[str], str]:
    import torch

    import splitsync as ss

    buf = io.StringIO()
    records = []
    with ss.init(seed=0, run_dir=run_dir) as run, contextlib.redirect_stdout(buf):
        # Numbers, a 0-d tensor, a one-element tensor, an int that differs by rank, a bool.
        records.append(run.log(epoch=1, loss=torch.tensor(1.0 + 2 * rank),
                               acc=[0.5, 0.7][rank], items=torch.tensor([10 * (rank + 1)]),
                               step=3 + rank, ok=True))
        records.append(run.log(epoch=2, loss=float(rank), lr=0.1))  # a new column
        for i in range(3):  # the same mix in a loop, as in a training step
            run.log(epoch=3, loss=torch.tensor(float(i)))
        bar = io.StringIO()  # not a terminal: plain lines on rank 0, nothing on rank 1
        with contextlib.redirect_stdout(bar):
            assert list(run.progress(range(4), desc="p", every=2)) == [0, 1, 2, 3]
    files = sorted(p.name for p in Path(run_dir).iterdir()) if Path(run_dir).exists() else []
    return records, buf.getvalue(), files, bar.getvalue()


def test_log_averages_over_ranks_and_writes_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (rec0, out0, files0, bar0), (rec1, out1, _, bar1) = spawn(_log_rank, 2, str(run_dir),
                                                               timeout=120)
    assert [line.split()[1] for line in bar0.splitlines()] == ["2/4", "4/4"]
    assert bar1 == ""

    # Every rank gets the same averaged record back.
    assert rec0 == rec1
    first = rec0[0]
    assert first["loss"] == pytest.approx(2.0)     # (1 + 3) / 2
    assert first["acc"] == pytest.approx(0.6)
    assert first["items"] == pytest.approx(15.0)   # tensors average as floats
    assert first["step"] == 3.5                     # ints that differ become their mean
    assert first["epoch"] == 1 and isinstance(first["epoch"], int)  # same int stays an int
    assert first["ok"] == 1.0
    assert rec0[1] == {"epoch": 2, "loss": pytest.approx(0.5), "lr": pytest.approx(0.1)}

    # Printed once, by rank 0, in the caller's order.
    assert out1 == ""
    lines = out0.splitlines()
    assert len(lines) == 5
    assert lines[0].startswith("epoch 1 | loss 2 | acc 0.6 | items 15 | step 3.5")

    # Written once: five records, not ten.
    assert files0 == ["metrics.csv", "metrics.jsonl"] or "tensorboard" in files0
    jsonl = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(jsonl) == 5
    assert jsonl[0]["loss"] == pytest.approx(2.0) and jsonl[1]["lr"] == pytest.approx(0.1)
    assert [r["loss"] for r in jsonl[2:]] == [0.0, 1.0, 2.0]

    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5
    # The header grew when "lr" appeared; earlier rows keep an empty cell for it.
    assert list(rows[0]) == ["epoch", "loss", "acc", "items", "step", "ok", "lr"]
    assert rows[0]["lr"] == "" and float(rows[1]["lr"]) == pytest.approx(0.1)
    assert float(rows[0]["loss"]) == pytest.approx(2.0)


def test_log_rejects_what_it_cannot_average_by_name() -> None:
    import torch

    import splitsync as ss

    with ss.init(seed=0) as run:  # world size 1: validation happens before any collective
        with pytest.raises(TypeError, match=r"loss=.*\(3,\)"):
            run.log(loss=torch.ones(3))
        with pytest.raises(TypeError, match="name="):
            run.log(name="resnet")


def test_single_process_without_run_dir_prints_only(tmp_path: Path, monkeypatch) -> None:
    import splitsync as ss

    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    with ss.init(seed=0) as run, contextlib.redirect_stdout(buf):
        assert run.log(epoch=1, loss=0.25) == {"epoch": 1, "loss": 0.25}
    assert buf.getvalue() == "epoch 1 | loss 0.25\n"
    assert list(tmp_path.iterdir()) == []


def test_resumed_run_appends_under_the_existing_csv_header(tmp_path: Path) -> None:
    from splitsync.output.metrics import MetricsLog

    first = MetricsLog(tmp_path, echo=False)
    first.write({"epoch": 1, "loss": 0.5})
    first.close()
    again = MetricsLog(tmp_path, echo=False)  # a restarted process: a fresh sink
    again.write({"loss": 0.25, "epoch": 2})
    again.close()
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"epoch": "1", "loss": "0.5"}, {"epoch": "2", "loss": "0.25"}]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_tensorboard_gets_the_scalars_when_installed(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from splitsync.output.metrics import MetricsLog

    log = MetricsLog(tmp_path, echo=False)
    log.write({"step": 5, "loss": 0.5})
    log.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
