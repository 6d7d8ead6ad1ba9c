"""DDP options in run.model: the same script runs under python and `splitsync run -n 2`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from launch_helpers import SCRIPTS, env, splitsync

pytestmark = pytest.mark.slow
SCRIPT = str(SCRIPTS / "launch_ddp_options.py")


def test_find_unused_parameters_under_plain_python() -> None:
    r = subprocess.run([sys.executable, SCRIPT], env=env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "trained rank=0 world=1 strategy=single" in r.stdout


def test_find_unused_parameters_under_splitsync_run_two_processes() -> None:
    r = splitsync("run", "-n", "2", SCRIPT, timeout=180)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert f"trained rank={rank} world=2 strategy=ddp" in r.stdout
