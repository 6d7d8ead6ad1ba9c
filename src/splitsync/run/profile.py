"""``with run.profile(wait=1, warmup=1, active=3, ranks=(0,)):``, torch.profiler stepped by run.step.

On the chosen ranks, ``torch.profiler.profile`` runs with that schedule (CPU activity,
plus CUDA on a GPU); every ``run.step`` inside the block advances it, through an observer
(:class:`ProfileStepper`, ``on_step_end``) attached only while the block is open: outside
it, ``run.step`` is the plain one. Each finished active window is written by
``tensorboard_trace_handler`` as a Chrome trace (``<dir>/rank<r>.<time>.pt.trace.json``),
which TensorBoard's profiler plugin and Perfetto both open. When the block ends, the lowest profiled rank prints a short table
of the top ops by self time and writes it to ``<dir>/rank<r>-top-ops.txt``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from splitsync.observe import Observer

__all__ = ["profile_steps", "ProfileStepper", "PROFILE_DIR", "top_ops_table"]

PROFILE_DIR = "profile"
_log = logging.getLogger("splitsync")


def _check(wait: int, warmup: int, active: int, repeat: int) -> None:
    for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1),
                             ("repeat", repeat, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"run.profile({name}={value!r}): give an integer >= {low}.")


def top_ops_table(prof: Any, device: torch.device, rows: int = 10) -> str:
    """The ops that took the most self time (CUDA time on a GPU, CPU time otherwise)."""
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


class ProfileStepper(Observer):
    """Advances one profiler's schedule after every ``run.step``."""

    def __init__(self, prof: Any) -> None:
        self.prof = prof

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        self.prof.step()


@contextmanager
def profile_steps(run: Any, *, wait: int, warmup: int, active: int, repeat: int = 1,
                  ranks: Sequence[int] | None = (0,), dir: str | os.PathLike[str] | None = None,
                  rows: int = 10, record_shapes: bool = False, with_stack: bool = False,
                  profile_memory: bool = False) -> Iterator[Any]:
    """Profile this rank's steps (when it is among ``ranks``); yields the profiler or None."""
    _check(wait, warmup, active, repeat)
    chosen = tuple(range(run.world_size)) if ranks is None else tuple(ranks)
    bad = [r for r in chosen if not isinstance(r, int) or not 0 <= r < run.world_size]
    if bad or not chosen:
        raise ValueError(f"run.profile(ranks={ranks!r}): give ranks in 0..{run.world_size - 1}.")
    if dir is None:
        if run.config.run_dir is None:
            raise ValueError("run.profile() writes traces under run_dir: pass "
                             "init(run_dir=...) or run.profile(dir=...).")
        dir = Path(run.config.run_dir) / PROFILE_DIR
    dir = Path(dir)
    if any(isinstance(o, ProfileStepper) for o in run.observers):
        raise RuntimeError("run.profile() is already active; profiles do not nest.")
    if run.rank not in chosen:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU]
    if run.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    dir.mkdir(parents=True, exist_ok=True)
    prof = profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
        on_trace_ready=tensorboard_trace_handler(str(dir), worker_name=f"rank{run.rank}"),
        record_shapes=record_shapes, with_stack=with_stack, profile_memory=profile_memory,
    )
    prof.start()
    stepper = run.add_observer(ProfileStepper(prof))
    try:
        yield prof
    finally:
        run.remove_observer(stepper)  # run.step is the plain one again
        prof.stop()  # an unfinished active window is written now
    if prof.step_num < wait + warmup + 1:
        _log.warning("run.profile: the block ended after %d step(s), before the first active "
                     "step (wait=%d, warmup=%d); no trace was written.", prof.step_num, wait,
                     warmup)
        return
    table = top_ops_table(prof, run.device, rows)
    (dir / f"rank{run.rank}-top-ops.txt").write_text(table, encoding="utf-8")
    if run.rank == min(chosen):
        print(f"profile (rank {run.rank}, top {rows} ops by self time; traces in {dir}):\n"
              f"{table}", flush=True)
