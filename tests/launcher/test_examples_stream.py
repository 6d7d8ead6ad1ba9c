"""The streaming example, launched for real: HF streaming text, 1 and 2 processes, resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from launchkit import launch as launch_script

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "stream.py"
pytest.importorskip("datasets")
pytestmark = pytest.mark.slow


def _val_loss(out: str) -> float:
    found = re.findall(r"validation loss: (\d+\.\d+) nats/char", out)
    assert len(found) == 1, f"expected one final line (rank 0 only):\n{out}"
    return float(found[0])


def test_stream_two_processes_with_workers_learn(tmp_path: Path) -> None:
    out = launch_script(DEMO, 2, "--epochs", "2", "--workers", "2", "--run-dir", str(tmp_path),
                        cwd=ROOT, timeout=240)
    assert "2 process(es)" in out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    assert records[-1]["loss"] < records[0]["loss"]
    assert _val_loss(out) < 1.0  # far below a uniform guess over ASCII (ln 128 = 4.85)


def test_stream_resumes_on_another_process_count(tmp_path: Path) -> None:
    ck = str(tmp_path / "ck")
    launch_script(DEMO, 2, "--epochs", "1", "--ckpt-dir", ck, cwd=ROOT, timeout=240)
    out = launch_script(DEMO, 1, "--epochs", "2", "--ckpt-dir", ck, cwd=ROOT, timeout=240)
    assert "1 process(es)" in out and "at epoch 1" in out
    assert _val_loss(out) < 1.0
