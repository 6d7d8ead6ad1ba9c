"""A rank killed mid-epoch of a stream under an elastic launcher: the job resumes its stream
position and ends bit-equal to a run that was never killed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from launchkit import launch_anew, launch_command
from safetensors.torch import load_file
from stream_crash_script import spawn_entry

from splitsync.testing import clean_env, spawn

SCRIPT = Path(__file__).with_name("stream_crash_script.py")


@pytest.mark.extended  # tests/distributed/test_data_stream_resume.py resumes streams in the suite
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_rank_resumes_the_stream_exactly(tmp_path: Path) -> None:
    proc, folder = launch_anew(
        lambda d: launch_command(SCRIPT, 2, str(d / "ck"), str(d / "crashed.safetensors"),
                                 "--crash", max_restarts=1),
        tmp_path, env=clean_env(), timeout=240)
    crashed = folder / "crashed.safetensors"
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    # 32 samples, batch 2 on 2 ranks: 8 steps an epoch, 3 epochs
    assert "restart 1: resumed at step 3, ended at 24" in log, log  # it really was killed

    clean = tmp_path / "clean.safetensors"
    spawn(spawn_entry, 2, str(tmp_path / "ck2"), str(clean), timeout=120)
    a, b = load_file(crashed), load_file(clean)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
