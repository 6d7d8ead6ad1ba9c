"""The streaming example: HF streaming text on 2 processes with workers, then a resume on
1 process; one launch and one run in this interpreter, where two tests took three launches."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from launchkit import launch as launch_script
from launchkit import run_here

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "stream.py"
pytestmark = pytest.mark.slow


def _val_loss(out: str) -> float:
    found = re.findall(r"validation loss: (\d+\.\d+) nats/char", out)
    assert len(found) == 1, f"expected one final line (rank 0 only):\n{out}"
    return float(found[0])


@pytest.mark.extended  # tests/distributed/test_data_stream_resume.py resumes streams in the suite
@pytest.mark.timeout(420)  # above the launch's 240 s and the run in process
def test_stream_two_processes_with_workers_learn_and_resume_on_one(tmp_path: Path) -> None:
    pytest.importorskip("datasets")  # here, not at import: collection stays light
    ck, logs = str(tmp_path / "ck"), tmp_path / "logs"
    first = launch_script(DEMO, 2, "--epochs", "1", "--workers", "2", "--ckpt-dir", ck,
                          "--run-dir", str(logs), cwd=ROOT, timeout=240)
    assert "2 process(es)" in first
    # The second epoch on another process count, from the stream position saved above.
    out = run_here(DEMO, "--epochs", "2", "--ckpt-dir", ck, "--run-dir", str(logs), cwd=ROOT)
    assert "1 process(es)" in out and "at epoch 1" in out
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]  # one line per epoch, across the restart
    assert records[-1]["loss"] < records[0]["loss"]
    assert _val_loss(out) < 1.0  # far below a uniform guess over ASCII (ln 128 = 4.85)
