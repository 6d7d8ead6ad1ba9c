"""The tensor-parallel example, launched for real: TP 2 on two processes, then one process
resuming its checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launchkit import launch, run_here

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tp_transformer.py"
pytestmark = pytest.mark.slow


def _final(out: str) -> float:
    found = re.findall(r"final loss: ([0-9.]+)", out)
    assert len(found) == 1, out  # rank 0 only
    return float(found[0])


def test_tp_example_runs_and_resumes_on_one_process(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    out = launch(EXAMPLE, 2, "--tp", "2", "--steps", "40", "--resume", ckpt, cwd=ROOT,
                 timeout=240)
    assert "2 process(es): dp 1 x tp 2" in out and "starting at step 0" in out
    final = _final(out)
    out = run_here(EXAMPLE, "--tp", "1", "--steps", "60", "--resume", ckpt, cwd=ROOT)
    assert "1 process(es): dp 1 x tp 1" in out
    assert "starting at step 40" in out  # the TP checkpoint, resharded to one process
    assert abs(_final(out) - final) < 1.0
