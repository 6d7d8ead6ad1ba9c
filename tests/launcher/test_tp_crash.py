"""A rank of a tp 2 x dp_shard 2 job killed mid-run under an elastic launcher: the job
resumes from its background save and ends bit-equal to the job never killed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from launchkit import launch_anew, launch_command

from splitsync.testing import clean_env

SCRIPT = Path(__file__).with_name("tp_crash_script.py")
pytestmark = [pytest.mark.slow, pytest.mark.extended, pytest.mark.timeout(600)]


def test_tp_job_killed_and_restarted_ends_bit_equal(tmp_path: Path) -> None:
    env = clean_env()
    runs = {}
    for name, extra, restarts in (("killed", ("--crash",), 1), ("clean", (), 0)):
        proc, folder = launch_anew(
            lambda d, extra=extra, restarts=restarts: launch_command(
                SCRIPT, 4, str(d / "ck"), str(d / "out.pt"), *extra, max_restarts=restarts),
            tmp_path / name, env=env, timeout=560)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log
        runs[name] = (folder, log)
    # it was killed at step 7: resumed from step 6's background save, or from step 3's when
    # step 6's was still being written (a loaded machine): either way it ends bit-equal
    assert re.search(r"restart 1: resumed at step [36], ended at 12", runs["killed"][1]), \
        runs["killed"][1]
    assert "restart 0: resumed at step 0, ended at 12" in runs["clean"][1]
    a = torch.load(runs["killed"][0] / "out.pt", weights_only=True)
    b = torch.load(runs["clean"][0] / "out.pt", weights_only=True)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), {k: (a[k] - b[k]).abs().max() for k in a}
