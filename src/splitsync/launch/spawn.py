"""Run a function on N CPU ranks with gloo: free port, clean environment, hard timeout.

Used by splitsync verify, bench and plan, by the test suite, and by users (as
``splitsync.testing.spawn``)::

    from splitsync.launch.spawn import spawn

    def check(rank: int, world_size: int) -> float: ...
    results = spawn(check, world_size=2)   # [result of rank 0, result of rank 1]

``fn`` must be importable (defined at module level): ranks are started from a fork server
that has imported torch once ("forkserver"), so a rank starts in a tenth of a second instead
of importing torch again; ``start_method="spawn"`` starts each rank from scratch.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from splitsync.distributed.env import TORCHRUN, launched_env
from splitsync.distributed.group import free_port
from splitsync.distributed.procs import children
from splitsync.errors import SpawnError
from splitsync.preemption.defaults import DUMP_SIGNAL_NAME

__all__ = ["spawn", "SpawnError", "clean_env", "LAUNCHER_PREFIXES", "FORKSERVER_PRELOAD"]

# What the fork server imports once, before it forks ranks: the bulk of a rank's start time.
# One list for every user of this process's fork server (verify's launcher too): whichever
# starts it first, its ranks find these imported. torch.distributed.checkpoint alone costs a
# rank about a second of CPU to import.
FORKSERVER_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel",
                      "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
                      "torch.distributed.fsdp", "splitsync.run.runtime", "splitsync.ckpt",
                      "splitsync.strategies")

LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "MPI_LOCAL", "TORCHELASTIC_", "PMIX_")
LAUNCHER_VARS = (
    *TORCHRUN.names, "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
)


def clean_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ) without any launcher variables, single-threaded BLAS."""
    env = {
        k: v for k, v in (os.environ if base is None else base).items()
        if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)
    }
    env["OMP_NUM_THREADS"] = "1"
    return env


# Where a hung rank's stacks come from: the parent sends this signal on timeout, and the rank
# (and any worker it forked, which inherits the handler) writes every thread's Python stack.
# One no run stops on by default (the preemption defaults choose it).
_DUMP_SIGNAL = getattr(signal, DUMP_SIGNAL_NAME, None)


def _child(call: bytes, rank: int, world: int, port: int, env: dict[str, str], out: Any,
           dump: str) -> None:
    if _DUMP_SIGNAL is not None:
        stacks = open(dump, "w")  # noqa: SIM115 - open until this process exits
        faulthandler.register(_DUMP_SIGNAL, file=stacks, all_threads=True)
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(launched_env(rank, world, port))
    if _DUMP_SIGNAL is not None:
        # init's guards keep this dump as it is (this process's only: "pid:path")
        os.environ["SPLITSYNC_STACKS_FILE"] = f"{os.getpid()}:{dump}"
    # A spawned child inherits "spawn" as its default start method; ranks started by
    # torchrun have the platform default, so DataLoader workers behave the same here.
    mp.set_start_method(None, force=True)
    try:
        import torch

        torch.set_num_threads(1)
        # Unpickled only now, with the rank's environment in place: importing fn's module
        # (and what it imports, which may read the environment once) sees ``env``, not the
        # environment the fork server started with.
        fn, args = pickle.loads(call)  # our own parent's bytes
        # Plain pickle copies tensor data; torch's queue reducers would share memory that
        # vanishes when this process exits.
        out.put((rank, True, pickle.dumps(fn(rank, world, *args))))
    except BaseException:  # report everything, including SystemExit, to the parent
        out.put((rank, False, traceback.format_exc()))
    # Deliver the result before tearing down: a teardown that blocks must not hold it back.
    out.close()
    out.join_thread()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _context(start_method: str) -> Any:
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method={start_method!r}: give 'forkserver' or 'spawn'.")
    if start_method not in mp.get_all_start_methods():  # forkserver: Unix only
        start_method = "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # Takes effect when this process first starts its fork server; later calls reuse it.
        ctx.set_forkserver_preload(["__main__", *FORKSERVER_PRELOAD])
    return ctx


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 120.0,
          env: Mapping[str, str] | None = None, start_method: str = "forkserver") -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes; return results.

    Each rank is a new process with a clean environment (``env``, default this process's,
    less any launcher variables). ``start_method="forkserver"`` (the default where the
    platform has it) forks ranks from a server that has imported torch once;
    ``"spawn"`` starts each from scratch.

    Raises :class:`SpawnError` naming the ranks that failed (with their tracebacks) or did
    not finish within ``timeout`` seconds, with the Python stacks of every thread of those
    ranks and of the processes they forked (sent SIGUSR2 first, where there is one); every
    child, and what it forked, is killed in both cases.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: need at least one rank.")
    ctx = _context(start_method)
    out = ctx.Queue()
    port = free_port()
    child_env = clean_env(env)
    call = pickle.dumps((fn, args))
    dumps = tempfile.mkdtemp(prefix="splitsync-spawn-")
    procs = [
        ctx.Process(target=_child, args=(call, r, world_size, port, child_env, out,
                                         os.path.join(dumps, f"rank{r}.txt")),
                    daemon=False)  # ranks may start DataLoader workers
        for r in range(world_size)
    ]
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    stacks = ""
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + timeout
        while len(results) + len(failures) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, ok, value = out.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and r not in results and r not in failures]
                for r in dead:
                    failures[r] = f"rank {r} exited with code {procs[r].exitcode} and no result"
                continue
            if ok:
                results[rank] = pickle.loads(value)  # our own child's bytes
            else:
                failures[rank] = value
        hung = [r for r in range(world_size) if r not in results and r not in failures]
        if hung and not failures:
            stacks = _stacks(procs, hung, dumps)
    finally:
        for p in procs:
            if p.is_alive():
                # what the rank forked (DataLoader workers) first: orphans would live on
                for pid in _descendants(p.pid):
                    _signal(pid, signal.SIGKILL)
                p.kill()
            p.join(timeout=5)
        shutil.rmtree(dumps, ignore_errors=True)
    if failures:
        first = min(failures)
        raise SpawnError(f"rank(s) {sorted(failures)} failed; rank {first}:\n{failures[first]}")
    missing = sorted(set(range(world_size)) - set(results))
    if missing:
        raise SpawnError(f"rank(s) {missing} did not finish within {timeout:.0f}s (hang?)"
                         + stacks)
    return [results[r] for r in range(world_size)]


def _descendants(pid: int) -> list[int]:
    """Processes forked below ``pid`` (Linux's /proc; none elsewhere)."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found.extend(kids)
        todo.extend(kids)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass  # gone meanwhile


def _stacks(procs: list[Any], hung: list[int], dumps: str, wait: float = 3.0) -> str:
    """Every thread's stack in the hung ranks and what they forked, for the error."""
    if _DUMP_SIGNAL is None:
        return ""
    for r in hung:
        pid = procs[r].pid
        for p in (pid, *_descendants(pid)):
            _signal(p, _DUMP_SIGNAL)
    paths = [os.path.join(dumps, f"rank{r}.txt") for r in hung]
    until = time.monotonic() + wait  # the handlers write at once; a loaded machine lags
    while time.monotonic() < until and not all(
            os.path.exists(p) and os.path.getsize(p) for p in paths):
        time.sleep(0.05)
    time.sleep(0.2)  # the workers those ranks forked write to the same files
    parts = []
    for r in hung:
        try:
            with open(os.path.join(dumps, f"rank{r}.txt")) as f:
                text = f.read()
        except OSError:
            text = ""
        parts.append(f"\n--- stacks of rank {r} and the processes it forked ---\n"
                     + (text[-8000:] or "(none written)\n"))
    return "".join(parts)
