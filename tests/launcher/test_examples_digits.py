"""The main demo, launched for real: 2 processes reach >= 95% exact validation accuracy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from launchkit import launch as launch_script

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "digits.py"
pytestmark = pytest.mark.slow


def launch(script: Path, nproc: int, *args: str, timeout: float = 150) -> str:
    """Run ``script`` on ``nproc`` processes; return its output; fail on error or timeout."""
    return launch_script(script, nproc, *args, cwd=ROOT, timeout=timeout)


def _accuracy(out: str) -> float:
    found = re.findall(r"validation accuracy: (\d+\.\d)%", out)
    assert len(found) == 1, f"expected one final accuracy line (rank 0 only):\n{out}"
    return float(found[0])


def test_digits_two_processes_reach_95_percent(tmp_path: Path) -> None:
    out = launch(DEMO, 2, "--epochs", "6", "--run-dir", str(tmp_path))
    assert "2 process(es)" in out
    assert _accuracy(out) >= 95.0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5, 6]  # logged once per epoch
    assert records[-1]["val_acc"] == pytest.approx(_accuracy(out) / 100, abs=5e-4)
    assert records[-1]["loss"] < records[0]["loss"]
    assert all(r["samples_per_s"] > 0 for r in records)


def test_digits_one_process_with_flags() -> None:
    out = launch(DEMO, 1, "--epochs", "2", "--batch-size", "64", "--lr", "5e-3", "--seed", "1")
    assert "1 process(es)" in out and "batch 64 per process" in out
    assert _accuracy(out) >= 80.0  # two epochs on one process: well above chance (10%)


@pytest.mark.parametrize(
    ("nproc", "flags"),
    [
        (2, ("--strategy", "fsdp")),
        (1, ("--precision", "bf16-mixed")),
        (1, ("--accumulate", "2")),
    ],
)
def test_digits_training_features_keep_95_percent(nproc: int, flags: tuple[str, ...]) -> None:
    out = launch(DEMO, nproc, *flags)
    assert _accuracy(out) >= 95.0
