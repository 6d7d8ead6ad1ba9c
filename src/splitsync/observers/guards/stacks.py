"""Every rank's Python stacks at a failure: ``faulthandler`` on, and the stack of a rank that
is not inside any collective (with its DataLoader worker's, when it waits on one).

``enable`` (from ``init``, so under torchrun and srun too) turns on ``faulthandler`` for
every thread: a rank that aborts or crashes in C++ (SIGABRT, SIGSEGV, SIGBUS) prints its
Python stacks. SIGUSR2 dumps them on request (the hang guard asks a DataLoader worker this
way; forked workers inherit it), and under torchrun's agent (``splitsync run`` or torchrun)
the SIGTERM that stops the other ranks when one dies dumps them first: into the job's state
folder under ``splitsync run``, to standard error under torchrun. A script that installs its
own SIGTERM handler afterwards (``run.resume``'s preemption handling) replaces that dump.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import tempfile
import time
import traceback
from types import FrameType
from typing import IO, Any

from splitsync.distributed.procs import children
from splitsync.distributed.rankstate import (
    innermost_user_line,
    main_thread_block,
    stacks_path,
    write_state,
)
from splitsync.observers.guards.site import library_dirs, user_site
from splitsync.preemption.defaults import DUMP_SIGNAL_NAME

__all__ = ["enable", "DUMP_SIGNAL", "STACKS_FILE_VAR", "own_stacks_file", "stack_lines", "loader_worker", "worker_stack",
           "stuck_in_fork", "fork_note",
           "worker_site", "stop_children"]

# the one signal no run stops on (spawn's timeout dump uses it too)
DUMP_SIGNAL = getattr(signal, DUMP_SIGNAL_NAME, None)
STACKS_FILE_VAR = "SPLITSYNC_STACKS_FILE"  # where this process's SIGUSR2 dumps go
_LOADER_FILE = os.path.join("torch", "utils", "data", "dataloader.py")
_WORKER_WAIT_S = 2.0


def enable(rank: int, folder: str | None) -> str | None:
    """Turn on the dumps for this process; returns the file that on-request dumps (SIGUSR2)
    go to, which a forked DataLoader worker inherits.

    Fatal dumps go to the state folder under ``splitsync run`` (the launcher prints them),
    else to stderr; a user's own ``faulthandler.enable`` is kept there. A dump file set up by
    ``splitsync.testing.spawn`` (``SPLITSYNC_STACKS_FILE``) is kept as it is."""
    out = _stderr_with_fd()
    if folder is not None:
        out = open(stacks_path(folder, rank), "a")  # noqa: SIM115 - open until exit
    if out is not None and (folder is not None or not faulthandler.is_enabled()):
        faulthandler.enable(file=out, all_threads=True)
    path = own_stacks_file(os.environ.get(STACKS_FILE_VAR, ""))
    if DUMP_SIGNAL is not None and path is None:
        if folder is not None:
            path, requested = stacks_path(folder, rank), out
        else:  # a file of its own, so that a worker's dump can be read back
            fd, path = tempfile.mkstemp(prefix=f"splitsync-stacks-rank{rank}-", suffix=".txt")
            requested = os.fdopen(fd, "a")
            path = _unlinked(path, fd)
        faulthandler.register(DUMP_SIGNAL, file=requested, all_threads=True)
        os.environ[STACKS_FILE_VAR] = f"{os.getpid()}:{path}"
    under_agent = folder is not None or "TORCHELASTIC_RUN_ID" in os.environ
    if out is not None and under_agent and \
            signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        # torchrun's agent stops the others with SIGTERM when one rank dies: stacks first
        faulthandler.register(signal.SIGTERM, file=out, all_threads=True, chain=True)
    if folder is not None and not isinstance(sys.excepthook, _RecordRaised):
        sys.excepthook = _RecordRaised(rank, folder, sys.excepthook)
    return path


def _stderr_with_fd() -> IO[str] | None:
    """Standard error, if it has a file descriptor (faulthandler writes to one); in a Jupyter
    kernel ``sys.stderr`` has none, and the process's own is ``sys.__stderr__``."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
            continue
    return None


def own_stacks_file(value: str) -> str | None:
    """The dump file named in ``SPLITSYNC_STACKS_FILE`` ("pid:path") if it was set up for
    this very process; a child inherits the variable but not the handler."""
    pid, _, path = value.partition(":")
    return path if path and pid == str(os.getpid()) else None


def _unlinked(path: str, fd: int) -> str:
    """The dump file's name once nothing is left on disk: where the kernel shows open files
    (Linux), the file is unlinked at once and read through ``/proc/<pid>/fd/<fd>``, so a rank
    that is killed or leaves by ``os._exit`` leaves no file behind; elsewhere it is removed
    at a normal exit."""
    proc = f"/proc/{os.getpid()}/fd/{fd}"
    if os.path.exists(proc):
        _remove(path)
        return proc
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _RecordRaised:
    """``sys.excepthook`` under ``splitsync run``: note the exception and the user's line for
    the launcher's summary, then print it as before. An earlier state is kept (a failed
    collective's account says more than the error it raised)."""

    def __init__(self, rank: int, folder: str, previous: Any) -> None:
        self.rank, self.folder, self.previous = rank, folder, previous

    def __call__(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        frame, walk = None, tb
        while walk is not None:  # the innermost frame: user_site climbs out from there
            frame, walk = walk.tb_frame, walk.tb_next
        site = user_site(frame) if frame is not None else "?"
        write_state(self.folder, self.rank, {
            "rank": self.rank, "state": "raised", "site": site,
            "error": f"{kind.__name__}: {str(value)[:200]}"}, keep=True)
        self.previous(kind, value, tb)


def stack_lines(frame: FrameType | None, limit: int = 8) -> list[str]:
    """The main thread's innermost frames, user's and library's, most recent last."""
    if frame is None:
        return []
    summary = traceback.extract_stack(frame)[-limit:]
    return [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in summary]


def _short(path: str) -> str:
    full = os.path.abspath(path)
    cwd = os.getcwd() + os.sep
    return full[len(cwd):] if full.startswith(cwd) else full


def loader_worker(frame: FrameType | None) -> tuple[int, int] | None:
    """(worker id, pid) of the DataLoader worker the main thread is waiting for, if any."""
    f = frame
    while f is not None:
        if f.f_code.co_filename.endswith(_LOADER_FILE):
            it = f.f_locals.get("self")
            info = _awaited(it)
            if info is not None:
                return info
        f = f.f_back
    return None


def _awaited(it: Any) -> tuple[int, int] | None:
    """The worker that owes the batch the iterator waits for (torch's own bookkeeping)."""
    try:
        task = it._task_info.get(it._rcvd_idx)
        if task is None or len(task) != 1:  # (worker_id,) while the batch is outstanding
            return None
        worker_id = int(task[0])
        proc = it._workers[worker_id]
        return worker_id, int(proc.pid)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


def forked(pid: int) -> bool:
    """Whether this process forked ``pid`` (a DataLoader worker started by "fork" inherits
    the SIGUSR2 dump; one started by "spawn" or "forkserver" would be killed by it)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        if child.pid == pid:
            return getattr(getattr(child, "_popen", None), "method", None) == "fork"
    return False


def worker_stack(pid: int, dump_file: str | None, wait: float = _WORKER_WAIT_S) -> list[str]:
    """The worker's Python stack: it inherited the SIGUSR2 dump (forked), and writes to the
    rank's file; read what it appended. Empty where the worker was not forked (it has no
    dump to give) or none came."""
    if DUMP_SIGNAL is None or dump_file is None or not forked(pid):
        return []
    try:
        before = os.path.getsize(dump_file)
    except OSError:
        return []
    if not _kill(pid):
        return []
    until = time.monotonic() + wait
    text = ""
    while time.monotonic() < until:
        time.sleep(0.1)
        with open(dump_file) as f:
            f.seek(before)
            text = f.read()
        if "File " in text:
            time.sleep(0.1)  # the rest of the dump
            with open(dump_file) as f:
                f.seek(before)
                text = f.read()
            break
    return main_thread_block(text)[:12]  # a worker's main thread: the last one it writes


def stuck_in_fork(frames: list[str]) -> bool:
    """Whether a worker's dump (most recent first) ends inside ``os.fork`` itself: the child
    never returned from the fork, so none of the worker's own code ran."""
    return bool(frames) and os.path.join("multiprocessing", "popen_fork.py") in frames[0] \
        and frames[0].rstrip().endswith(" in _launch")


def fork_note(rank: int) -> str:
    """Why a worker hangs inside ``os.fork``, and what avoids it."""
    import platform

    return (f"The worker never left fork(): it was copied from rank {rank} while another "
            "thread of that process (a C++ one entering Python: gloo's, say) held one of "
            "Python's internal locks, and the copy waits for it forever. This is a CPython "
            f"bug (python/cpython#112275, fixed in 3.12; this is {platform.python_version()}) "
            "that DataLoader workers started by 'fork' can hit in any process with threads. "
            "Fix: start them with run.loader(..., multiprocessing_context='forkserver') (or "
            "'spawn'; the dataset must then be picklable), or use a Python without the bug.")


def worker_site(frames: list[str]) -> str:
    """The user's line a DataLoader worker is at, from its dump ("?" if none)."""
    return innermost_user_line(frames, library_dirs()) or "?"


def stop_children() -> None:
    """Kill the processes this one forked (DataLoader workers) before it ends: a worker stuck
    in the user's dataset would outlive it, holding the job's output open."""
    # no /proc: none found, and a worker notices its parent is gone at its next batch
    for pid in children(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, DUMP_SIGNAL)  # type: ignore[arg-type]
        return True
    except OSError:
        return False

