"""DDP options in run.model: the same script runs under python and `splitsync run -n 2`.

The one-process case is about the script (the option is ignored at world size 1), so it
runs in this interpreter; the two-process case is a real launch.
"""

from __future__ import annotations

import pytest
from launch_helpers import SCRIPTS, splitsync
from launchkit import run_here

pytestmark = pytest.mark.slow
SCRIPT = str(SCRIPTS / "launch_ddp_options.py")


def test_find_unused_parameters_under_plain_python() -> None:
    assert "trained rank=0 world=1 strategy=single" in run_here(SCRIPT)


def test_find_unused_parameters_under_splitsync_run_two_processes() -> None:
    r = splitsync("run", "-n", "2", SCRIPT, timeout=180)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert f"trained rank={rank} world=2 strategy=ddp" in r.stdout
