"""Shared helpers of the launcher tests: run the CLI in a clean environment with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launchkit import ATTEMPTS, teardown_abort

from splitsync.testing import clean_env

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
SRC = HERE.parent.parent / "src"


def env(**extra: str) -> dict[str, str]:
    """No launcher variables, splitsync's sources first, no GPU."""
    e = clean_env()
    e.pop("OMP_NUM_THREADS", None)  # let `splitsync run` choose and say so
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["CUDA_VISIBLE_DEVICES"] = ""
    e.update(extra)
    return e


def stop(proc: subprocess.Popen[str]) -> None:
    """End a launcher that is still running: SIGTERM first, so torchrun stops its workers
    (they run in sessions of their own), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


def splitsync(*args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m splitsync ARGS`` with a hard timeout; output captured.

    A run that died only by gloo's abort at interpreter exit is run again, up to
    ``launchkit.ATTEMPTS`` launches in all (see ``launchkit.teardown_abort``).
    """
    for _ in range(ATTEMPTS):
        proc = subprocess.Popen([sys.executable, "-m", "splitsync", *args], env=env(**extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            stop(proc)
        if not teardown_abort(proc.returncode, err):
            break
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def ranks_in(out: Path) -> set[int]:
    """The ranks that left a rank_<N> file."""
    return {int(p.name.split("_")[1]) for p in out.glob("rank_*")}


def endpoint_port() -> int:
    """A free loopback port below the kernel's ephemeral range.

    Several agents must agree on the port before any of them binds it; a port from
    ``bind(0)`` is released and could be handed out again to another process's
    ``bind(0)`` in the meantime. Ports below 32768 are never handed out that way.
    """
    import random
    import socket

    for _ in range(100):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000 on 127.0.0.1")
