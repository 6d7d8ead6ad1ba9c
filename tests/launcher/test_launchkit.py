"""The launch helper that runs a job again only when gloo aborted it at interpreter exit."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from launchkit import ATTEMPTS, TEARDOWN_ABORT, launch_anew

from splitsync.testing import clean_env

# Aborts like gloo's teardown in the folders named in argv[2:], else exits with argv[1].
JOB = f"""
import os, sys
folder = os.path.basename(sys.argv[-1])
if folder in sys.argv[2:-1]:
    sys.stderr.write({TEARDOWN_ABORT!r} + "\\n")
    sys.stderr.flush()
    os.abort()
open(os.path.join(sys.argv[-1], "ran"), "w").close()
sys.exit(int(sys.argv[1]))
"""


def _job(code: int, *aborting: str) -> Callable[[Path], list[str]]:
    return lambda d: [sys.executable, "-c", JOB, str(code), *aborting, str(d)]


def test_a_teardown_abort_is_run_again_in_a_new_folder(tmp_path: Path) -> None:
    proc, folder = launch_anew(_job(0, "launch-0"), tmp_path, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert folder == tmp_path / "launch-1" and (folder / "ran").exists()
    assert not (tmp_path / "launch-0" / "ran").exists()


def test_any_other_failure_is_returned_at_once(tmp_path: Path) -> None:
    proc, folder = launch_anew(_job(3), tmp_path, env=clean_env(), timeout=60)
    assert proc.returncode == 3 and folder == tmp_path / "launch-0"
    assert not (tmp_path / "launch-1").exists()


def test_launches_are_bounded(tmp_path: Path) -> None:
    every = [f"launch-{i}" for i in range(ATTEMPTS)]
    proc, folder = launch_anew(_job(0, *every), tmp_path, env=clean_env(), timeout=60)
    assert proc.returncode in (134, -6) and folder == tmp_path / every[-1]
