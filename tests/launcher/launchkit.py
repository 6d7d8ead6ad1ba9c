"""Run a script the way users do, through ``splitsync run``, with a hard timeout.

A test about what a script does, not about the launcher, runs it for less: ``run_here``
runs a one-process script in this interpreter (no fresh ``import torch``), and
``run_ranks`` runs it on N ranks forked from ``splitsync.testing.spawn``'s fork server,
with the variables a launcher exports.
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from splitsync.testing import LAUNCHER_PREFIXES, LAUNCHER_VARS, clean_env, spawn


def launch_command(script: Path | str, nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    """``python script`` for one process, else ``python -m splitsync run -n N script``."""
    if nproc == 1 and max_restarts == 0:
        return [sys.executable, str(script), *args]
    extra = ["--max-restarts", str(max_restarts)] if max_restarts else []
    return [sys.executable, "-m", "splitsync", "run", "-n", str(nproc), *extra, str(script), *args]


# A worker can abort in interpreter teardown, after the script's work is done: a thread
# that still drops the last reference to a tensor then needs the GIL, which is gone, and
# exits through C++ code that may not throw, which calls std::terminate. splitsync's own
# threads are done before run.close() returns (tests/unit/test_ckpt_threads.py); threads
# inside torch's gloo can still do it (see pytorch pull 179291). A launch that dies exactly
# that way is run once more; any other failure counts at once.
TEARDOWN_ABORT = "terminate called without an active exception"


#: Launches of one run, when every one before died only by gloo's abort at exit: each has
#: a 1-2% chance of it, and two in a row did happen in a full run.
ATTEMPTS = 3


def teardown_abort(returncode: int, err: str) -> bool:
    """True when a run failed only by gloo's abort at interpreter exit (SIGABRT)."""
    return returncode in (134, -6) and TEARDOWN_ABORT in err


def launch_anew(command: Callable[[Path], list[str]], root: Path, *, env: Mapping[str, str],
               timeout: float) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run ``command(folder)`` for a new ``folder`` under ``root``, output captured. A launch
    that died only by gloo's abort at exit (:func:`teardown_abort`) is run again from the
    start in another folder (a job that resumes must not find the last one's checkpoints),
    up to ``ATTEMPTS`` launches in all. Returns the last launch and its folder."""
    for attempt in range(ATTEMPTS):
        folder = root / f"launch-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(command(folder), env=dict(env), capture_output=True, text=True,
                              timeout=timeout)
        if not teardown_abort(proc.returncode, proc.stdout + proc.stderr):
            break
    return proc, folder


def launch(script: Path | str, nproc: int, *args: str, cwd: Path | None = None,
           timeout: float = 150, max_restarts: int = 0) -> str:
    """Run ``script`` on ``nproc`` processes; return its standard output.

    Standard error is kept apart (warnings written there could land inside a stdout line
    of another rank) and shown when the run fails or times out.
    """
    cmd = launch_command(script, nproc, *args, max_restarts=max_restarts)
    for _ in range(ATTEMPTS):
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


@contextlib.contextmanager
def _as_main(script: Path, args: tuple[str, ...], cwd: Path | None) -> Iterator[io.StringIO]:
    """``sys.argv``, ``sys.path[0]`` and the working directory of ``python script args``;
    standard output captured. Modules imported from the script's folder are forgotten
    afterwards, so the next script gets its own copy."""
    folder = str(script.parent)
    saved = (list(sys.argv), list(sys.path), os.getcwd(), set(sys.modules))
    sys.argv[:] = [str(script), *args]
    sys.path.insert(0, folder)
    if cwd is not None:
        os.chdir(cwd)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            yield out
    finally:
        sys.argv[:], sys.path[:] = saved[0], saved[1]
        os.chdir(saved[2])
        for name in set(sys.modules) - saved[3]:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if os.path.dirname(origin) == folder:
                del sys.modules[name]


def _run_main(script: Path, args: tuple[str, ...], cwd: Path | None) -> str:
    with _as_main(script, args, cwd) as out:
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise AssertionError(
                    f"{script.name} exited {exc.code!r}:\n{out.getvalue()}") from exc
    return out.getvalue()


def run_here(script: Path | str, *args: str, cwd: Path | None = None) -> str:
    """Run ``python script args`` in this process, outside any launcher; return its output."""
    saved = dict(os.environ)
    for key in list(os.environ):  # one process, as when started by hand
        if key in LAUNCHER_VARS or key.startswith(LAUNCHER_PREFIXES):
            del os.environ[key]
    try:
        return _run_main(Path(script), args, cwd)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _rank(rank: int, world_size: int, script: str, args: tuple[str, ...], cwd: str | None) -> str:
    return _run_main(Path(script), args, None if cwd is None else Path(cwd))


def run_ranks(script: Path | str, nproc: int, *args: str, cwd: Path | None = None,
              timeout: float = 150) -> str:
    """Run ``script`` as ``nproc`` ranks forked from the fork server (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT set as a launcher does); return their outputs in rank order."""
    outputs = spawn(_rank, nproc, str(script), args, None if cwd is None else str(cwd),
                    timeout=timeout)
    return "".join(outputs)
