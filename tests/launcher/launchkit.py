"""Run a script the way users do, through ``splitsync run``, with a hard timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from splitsync.testing import clean_env


def launch_command(script: Path | str, nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    """``python script`` for one process, else ``python -m splitsync run -n N script``."""
    if nproc == 1 and max_restarts == 0:
        return [sys.executable, str(script), *args]
    extra = ["--max-restarts", str(max_restarts)] if max_restarts else []
    return [sys.executable, "-m", "splitsync", "run", "-n", str(nproc), *extra, str(script), *args]


def launch(script: Path | str, nproc: int, *args: str, cwd: Path | None = None,
           timeout: float = 150, max_restarts: int = 0) -> str:
    """Run ``script`` on ``nproc`` processes; return its standard output.

    Standard error is kept apart (warnings written there could land inside a stdout line
    of another rank) and shown when the run fails or times out.
    """
    cmd = launch_command(script, nproc, *args, max_restarts=max_restarts)
    proc = subprocess.Popen(cmd, cwd=cwd, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker it started
        out, err = proc.communicate()
        pytest.fail(f"{Path(script).name} on {nproc} processes did not finish in {timeout}s:"
                    f"\n{out}\n{err}")
    assert proc.returncode == 0, f"{Path(script).name} exited {proc.returncode}:\n{out}\n{err}"
    return out
