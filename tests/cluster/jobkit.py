"""Start a training job under a real launcher, wait with a hard timeout, read what it wrote.

Every job runs ``scripts/train_tiny.py OUT``: rank 0 writes the final weights to
``OUT/weights.safetensors`` and every rank its identity (``run.env`` and the thread count)
to ``OUT/rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from splitsync.testing import clean_env

__all__ = ["SCRIPT", "job_env", "Job", "start_job", "finish_job", "run_job", "python"]

SCRIPT = Path(__file__).parent / "scripts" / "train_tiny.py"
# gloo can abort a rank at interpreter exit, after the script's work (see
# tests/launcher/launchkit.py): a job whose only failure is that, with every output
# written, trained.
TEARDOWN_ABORT = "terminate called without an active exception"


def python(*args: str) -> list[str]:
    """This interpreter (the test venv's, with splitsync installed) running ``args``."""
    return [sys.executable, *args]


def job_env(**extra: str) -> dict[str, str]:
    """The environment a user's shell gives a launcher: no launcher variables, and no
    OMP_NUM_THREADS (the test session's 1 would hide whether init sets it)."""
    env = clean_env()
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra)
    return env


@dataclass(frozen=True)
class Job:
    """A launched job: its launcher process and its output folder."""

    proc: subprocess.Popen[str]
    out: Path
    on_timeout: Callable[[], None] | None


def start_job(command: list[str], out: Path, env: dict[str, str],
              on_timeout: Callable[[], None] | None = None) -> Job:
    """Start ``command`` (which ends with the script's OUT argument) in its own session."""
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    return Job(proc, out, on_timeout)


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux's /proc)."""
    found, todo = [pid], [pid]
    while todo:
        parent = todo.pop()
        for tid in _listdir(f"/proc/{parent}/task"):
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def finish_job(job: Job, timeout: float) -> dict[str, Any]:
    """Wait for ``job``; fail the test, naming its output, unless it trained.

    Returns the weights' bytes (``"weights"``) and the ranks' identities (``"ranks"``).
    """
    deadline = time.monotonic() + timeout
    try:
        output, _ = job.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        if job.on_timeout is not None:
            job.on_timeout()  # e.g. scancel: srun's tasks are not its children
        for pid in reversed(_tree(job.proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        output, _ = job.proc.communicate()
        pytest.fail(f"{' '.join(map(str, job.proc.args))} did not finish in {timeout:.0f}s:"
                    f"\n{output[-6000:]}")
    result = _read(job.out)
    trained = job.proc.returncode == 0 or (TEARDOWN_ABORT in output and result is not None)
    assert trained and result is not None, (
        f"{' '.join(map(str, job.proc.args))} exited {job.proc.returncode}:\n{output[-6000:]}")
    result["output"] = output
    return result


def run_job(command: list[str], out: Path, env: dict[str, str], timeout: float,
            on_timeout: Callable[[], None] | None = None) -> dict[str, Any]:
    """:func:`start_job` then :func:`finish_job`."""
    return finish_job(start_job(command, out, env, on_timeout), timeout)


def _read(out: Path) -> dict[str, Any] | None:
    weights = out / "weights.safetensors"
    ranks = sorted(out.glob("rank*.json"))
    if not weights.exists() or not ranks:
        return None
    identities = [json.loads(p.read_text()) for p in ranks]
    return {"weights": weights.read_bytes(),
            "ranks": sorted(identities, key=lambda r: r["rank"])}
