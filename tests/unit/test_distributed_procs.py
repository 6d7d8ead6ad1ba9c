"""The processes a process forked, from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from splitsync.distributed.procs import children


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_a_started_child_is_listed_and_a_gone_process_has_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in children(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert child.pid not in children(os.getpid())
    assert children(child.pid) == []  # reaped: nothing under /proc for it
