"""init() arguments are validated before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

import splitsync
from splitsync.run.config import GuardSettings, RunConfig


def test_unknown_strategy_lists_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        RunConfig(strategy="zero3")
    for name in ("auto", "single", "ddp", "fsdp", "dp"):
        assert name in str(info.value)


def test_unknown_strategy_per_call() -> None:
    import torch

    with splitsync.init(seed=0) as run, pytest.raises(ValueError, match="Valid strategies"):
        run.model(torch.nn.Linear(2, 2), strategy="horovod")


def test_single_process_run_handle() -> None:
    import torch

    with splitsync.init(seed=3) as run:
        assert (run.rank, run.local_rank, run.world_size, run.is_main) == (0, 0, 1, True)
        assert run.backend == "gloo" and run.device.type in ("cpu", "cuda", "mps", "xpu")
        model = run.model(torch.nn.Linear(2, 2))
        assert type(model) is torch.nn.Linear  # no wrapper at world size 1
        assert run.unwrap(model) is model
        assert run.mean(3) == 3.0 and run.gather(torch.ones(2)).shape == (2,)
        assert run.broadcast({"a": 1}) == {"a": 1}


def test_ddp_without_group_is_a_clear_error() -> None:
    import torch

    with splitsync.init(seed=0) as run, pytest.raises(RuntimeError, match="splitsync run -n N"):
        run.model(torch.nn.Linear(2, 2), strategy="ddp")


def test_bad_accumulate_and_seed() -> None:
    with pytest.raises(ValueError, match="accumulate=0"):
        RunConfig(accumulate=0)
    with pytest.raises(ValueError, match="seed=-1"):
        RunConfig(seed=-1)


def test_import_is_lazy() -> None:
    import subprocess
    import sys

    code = "import sys, splitsync; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_public_name_resolves() -> None:
    for name in splitsync.__all__:
        assert getattr(splitsync, name) is not None


def test_every_public_name_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    missing = [n for n in splitsync.__all__ if f"`{n}`" not in readme]
    assert not missing and "launch" in splitsync.__all__, missing


def test_every_run_verb_and_ss_function_is_in_the_readme_reference() -> None:
    """The README's reference table names every public attribute of a Run (methods,
    properties, and what init sets on it) and every top-level name."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = re.search(r"^## Reference: every run verb and ss function\n(.*?)(?=^## )", readme,
                      flags=re.S | re.M)
    assert table, "the README has no reference section"
    with splitsync.init(seed=0) as run:
        names = {n for n in (*dir(type(run)), *vars(run)) if not n.startswith("_")}
    missing = sorted(n for n in names if f"`run.{n}" not in table.group(1))
    assert not missing, f"run.* names the README reference leaves out: {missing}"
    top = [n for n in splitsync.__all__ if not n.startswith("__")]
    missing = sorted(n for n in top if f"`ss.{n}" not in table.group(1))
    assert not missing, f"ss.* names the README reference leaves out: {missing}"


def test_loggers_and_straggler_threshold_are_checked_in_the_config() -> None:
    assert RunConfig(loggers=["jsonl", "mlflow"]).loggers == ("jsonl", "mlflow")
    assert RunConfig(loggers="csv").loggers == ("csv",)
    with pytest.raises(ValueError, match="Valid loggers: jsonl, csv, tensorboard, wandb, mlflow"):
        RunConfig(loggers=["comet"])
    for bad in (-0.1, "high", True):
        with pytest.raises(ValueError, match="straggler_threshold"):
            GuardSettings(straggler_threshold=bad)  # type: ignore[arg-type]
    assert RunConfig(guarding=GuardSettings(straggler_threshold=None)).straggler_threshold is None
