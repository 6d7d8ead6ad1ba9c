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


# torch 2.13's gloo can abort a worker in interpreter teardown, after the script's work is
# done and its group destroyed: a C++ thread still joinable when its owner (a
# ProcessGroupGloo kept alive by a DDP reducer) is finalised calls std::terminate. It hits
# plain torchrun scripts too (see pytorch pull 179291). A launch that dies exactly that way
# is run once more; any other failure counts at once.
TEARDOWN_ABORT = "terminate called without an active exception"


def teardown_abort(returncode: int, err: str) -> bool:
    """True when a run failed only by gloo's abort at interpreter exit (SIGABRT)."""
    return returncode in (134, -6) and TEARDOWN_ABORT in err


def launch(script: Path | str, nproc: int, *args: str, cwd: Path | None = None,
           timeout: float = 150, max_restarts: int = 0) -> str:
    """Run ``script`` on ``nproc`` processes; return its standard output.

    Standard error is kept apart (warnings written there could land inside a stdout line
    of another rank) and shown when the run fails or times out.
    """
    cmd = launch_command(script, nproc, *args, max_restarts=max_restarts)
    for _ in range(2):
        proc = subprocess.Popen(cmd, cwd=cwd, env=clean_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker it started
            out, err = proc.communicate()
            pytest.fail(f"{Path(script).name} on {nproc} processes did not finish in "
                        f"{timeout}s:\n{out}\n{err}")
        if not teardown_abort(proc.returncode, err):
            break
    assert proc.returncode == 0, f"{Path(script).name} exited {proc.returncode}:\n{out}\n{err}"
    return out
