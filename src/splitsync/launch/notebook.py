"""``splitsync.launch(fn, nprocs=N, args=...)``: run a function on N local processes.

For notebooks and REPLs: ``fn(*args, **kwargs)`` runs on N processes of this machine, each
with the environment a launcher gives (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR on
loopback, a free MASTER_PORT), so ``splitsync.init()`` inside ``fn`` forms a gloo group
on CPU or takes one GPU per process. The ranks' return values come back as a list in
rank order; a rank that raises makes the call raise :class:`LaunchFailed` with that
rank's traceback, after every other rank is stopped.

Why fork: a function defined in a notebook cell lives in the kernel's ``__main__``;
``spawn`` (torch.multiprocessing's default) pickles functions by reference, and a fresh
interpreter has no such ``__main__.fn``. Pickling by value (cloudpickle) would be another
dependency and still miss the notebook's other state. A forked child already holds
``fn``, its closure and every object the cell made, so nothing is pickled on the way in
and only results travel back. The price is fork's rules, which are checked: CUDA must not
be initialised in the parent (a forked child cannot use it), and each child computes with
one intra-op thread (a child forked after the parent used its OpenMP pool hangs in its own
first parallel region; torchrun also starts ranks with OMP_NUM_THREADS=1).
``start_method="spawn"`` is there for importable functions, and where fork is missing.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import queue
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from splitsync.distributed.env import TORCHRUN, launched_env
from splitsync.distributed.ports import free_port
from splitsync.errors import LaunchFailed

__all__ = ["notebook_launch", "LaunchFailed", "GRACE_S"]

GRACE_S = 10.0  # after a rank fails, how long the others get to fail or finish on their own
LAUNCHER_VARS = (*TORCHRUN.names, "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _refuse_in_launched_process() -> None:
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            raise RuntimeError("splitsync.launch(fn, ...) was called inside a process group; "
                               "call it from a notebook or REPL, not from a launched rank.")
    set_vars = [v for v in (TORCHRUN.rank, TORCHRUN.world_size, TORCHRUN.local_rank)
                if v in os.environ]
    if set_vars:
        raise RuntimeError(f"splitsync.launch(fn, ...): {set_vars} are already set, so this "
                           "process is a rank of a launched job. Call fn directly there, or "
                           "start the notebook/REPL without those variables.")


def _gpu_count() -> int:
    import torch  # importing does not initialise CUDA

    if torch.cuda.is_initialized():
        raise RuntimeError(
            "splitsync.launch(fn, ...): CUDA is already initialised in this process, and a "
            "forked process cannot use it. Restart the kernel and call splitsync.launch "
            "before anything touches the GPU (no tensor .cuda()/.to('cuda'), no "
            "torch.cuda.current_device() in earlier cells); do the GPU work inside fn.")
    return torch.cuda.device_count()  # NVML based: does not initialise CUDA


def _start_method(requested: str | None, fn: Callable[..., Any]) -> str:
    methods = mp.get_all_start_methods()
    method = requested or ("fork" if "fork" in methods and sys.platform != "darwin" else "spawn")
    if method not in methods:
        raise ValueError(f"start_method={method!r} is not available here; choose one of "
                         f"{methods}.")
    if method != "fork":
        # Only fork inherits fn; the others pickle it by reference.
        where = getattr(fn, "__module__", None)
        try:
            pickle.dumps(fn)
        except Exception as exc:
            raise ValueError(
                f"splitsync.launch: fn cannot be sent to {method!r} processes ({exc}). "
                "Define it in an importable module, or use start_method='fork'.") from exc
        if where == "__main__" and not hasattr(sys.modules["__main__"], "__file__"):
            raise ValueError(
                f"splitsync.launch: fn {getattr(fn, '__qualname__', fn)!r} is defined in an "
                f"interactive session's __main__, which {method!r} processes cannot import. "
                "Use start_method='fork' (the default on Linux), or define fn in a module.")
    return method


def _child(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], rank: int,
           world: int, port: int, out: Any) -> None:
    for var in LAUNCHER_VARS:
        os.environ.pop(var, None)
    os.environ.update(launched_env(rank, world, port), OMP_NUM_THREADS="1")
    try:
        if "torch" in sys.modules:  # forked after torch was imported: OMP_NUM_THREADS is late
            sys.modules["torch"].set_num_threads(1)
        result = fn(*args, **kwargs)
        try:
            payload = pickle.dumps(result)
        except Exception as exc:
            raise TypeError(f"fn returned a {type(result).__name__} that cannot be pickled "
                            f"back to the notebook ({exc}); return plain data.") from exc
        out.put((rank, True, payload))
    except BaseException:  # report everything, SystemExit and KeyboardInterrupt included
        out.put((rank, False, traceback.format_exc()))
    finally:
        if "torch.distributed" in sys.modules:
            dist = sys.modules["torch.distributed"]
            if dist.is_initialized():  # fn forgot run.close(): do not leave a peer hanging
                dist.destroy_process_group()
    out.close()
    out.join_thread()


def notebook_launch(fn: Callable[..., Any], nprocs: int | None = None, args: Sequence[Any] = (),
                    kwargs: Mapping[str, Any] | None = None, *, timeout: float | None = None,
                    start_method: str | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``nprocs`` local processes; their results in rank order.

    ``nprocs=None``: one process per visible GPU, else one. ``timeout`` (seconds) stops
    every rank and raises when they have not all finished by then. Raises
    :class:`LaunchFailed` with the first failing rank's traceback.
    """
    if not callable(fn):
        raise TypeError(f"splitsync.launch(fn, ...): fn must be callable, not {type(fn).__name__}.")
    _refuse_in_launched_process()
    gpus = _gpu_count()
    if nprocs is None:
        nprocs = gpus or 1
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"splitsync.launch(fn, nprocs={nprocs!r}): give a number of "
                         "processes >= 1.")
    if gpus and nprocs > gpus:
        raise ValueError(f"splitsync.launch(fn, nprocs={nprocs}): only {gpus} GPU(s) are "
                         f"visible and each process takes one. Use nprocs<={gpus}, or hide the "
                         "GPUs (CUDA_VISIBLE_DEVICES='') to run CPU processes.")
    ctx = mp.get_context(_start_method(start_method, fn))
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, tuple(args), dict(kwargs or {}), r, nprocs,
                                              port, out), daemon=False)
             for r in range(nprocs)]
    for p in procs:
        p.start()
    try:
        results, failures = _collect(procs, out, timeout)
    finally:
        for p in procs:  # every child stops, whatever happened (Ctrl-C in the notebook too)
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        out.close()
    if failures:
        first = min(failures, key=lambda r: failures[r][0])
        others = sorted(set(failures) - {first})
        also = f" (rank(s) {others} failed after it)" if others else ""
        raise LaunchFailed(f"rank {first} of {nprocs} failed{also}:\n{failures[first][1]}",
                           first, failures[first][1])
    missing = sorted(set(range(nprocs)) - set(results))
    if missing:
        raise LaunchFailed(f"rank(s) {missing} did not finish within {timeout}s; all ranks "
                           "were stopped.", missing[0], "")
    return [results[r] for r in range(nprocs)]


def _collect(procs: list[Any], out: Any, timeout: float | None
             ) -> tuple[dict[int, Any], dict[int, tuple[float, str]]]:
    """Results and failures (time, traceback) by rank, until all report, one dies or time runs out."""
    results: dict[int, Any] = {}
    failures: dict[int, tuple[float, str]] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(results) + len(failures) < len(procs):
        now = time.monotonic()
        if failures:  # the others may be blocked in a collective with the failed rank
            deadline = min(math.inf if deadline is None else deadline,
                           min(t for t, _ in failures.values()) + GRACE_S)
        if deadline is not None and now >= deadline:
            break
        try:
            rank, ok, value = out.get(timeout=0.2)
        except queue.Empty:
            for r, p in enumerate(procs):
                if p.exitcode not in (None, 0) and r not in results and r not in failures:
                    failures[r] = (now, f"rank {r} exited with code {p.exitcode} and no result "
                                        "(killed, or crashed in native code)")
            continue
        if ok:
            results[rank] = pickle.loads(value)  # bytes from our own child process
        else:
            failures[rank] = (time.monotonic(), value)
    return results, failures
