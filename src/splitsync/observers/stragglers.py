"""Straggler report: which rank makes the others wait, from the all-reduce ``run.log`` does.

In data-parallel training the gradient all-reduce makes every rank wait for the slowest,
so wall time per step is the same everywhere and hides the culprit. What differs is the
time each rank spends on its own between the synchronising calls: loading data, the
forward pass, the loss and the optimizer, i.e. outside ``run.backward`` and the run's
collectives (``run.mean``, ``run.max``, ...). :class:`StepClock` is an observer of exactly
those calls (``around_collective``: two clock reads each, no communication); at
``run.log`` it sends this rank's mean own time per backward in the slot of its rank,
zeros elsewhere, inside the all-reduce ``run.log`` already does (``log_extra``), so rank 0
learns every rank's time without a collective of its own and reports when the spread
exceeds the threshold.

``splitsync.init`` attaches the clock to runs of two or more processes unless
``straggler_threshold=None``. Under FSDP the parameter all-gathers inside the forward also
wait for the slowest rank, which then shows as the others' own time: the report is made for
DDP-style training, where every wait sits in the backward's all-reduce.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from splitsync.distributed.logs import get_logger
from splitsync.observe import Observer
from splitsync.run.config import DEFAULT_STRAGGLER_THRESHOLD as DEFAULT_THRESHOLD

__all__ = ["StepClock", "StragglerReport", "straggler_report", "DEFAULT_THRESHOLD",
           "MIN_GAP_S", "BACKWARD_OP"]

MIN_GAP_S = 5e-3  # and at least 5 ms per step: below that it is scheduling noise
BACKWARD_OP = "backward (gradient all-reduce)"  # the observer protocol's name for it

T = TypeVar("T")
_now = time.perf_counter


class StepClock(Observer):
    """Own time (outside backward and collectives) and backwards counted, since ``take``."""

    def __init__(self, rank: int = 0, world_size: int = 1,
                 threshold: float = DEFAULT_THRESHOLD,
                 report: Callable[[str], None] | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.threshold = threshold
        self.report = report or _warn
        self.last: StragglerReport | None = None  # rank 0: the last report made
        self._mark = -1.0  # paused until the first backward ends: setup is not a step
        self._own = 0.0
        self._steps = 0
        self._since = -1.0  # start of the window, for the wall time per step
        self._period = 0.0
        self._loop = threading.get_ident()  # a background save's handshakes are not steps

    # --- the clock (the per-step path: keep it to two clock reads) ---------------------
    def around_collective(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        if threading.get_ident() != self._loop:
            return fn(*args)  # a background checkpoint's handshake: not the loop's time
        start = _now()
        if self._mark >= 0:
            self._own += start - self._mark
        elif self._since < 0:
            self._since = start
        try:
            return fn(*args)
        finally:
            self._mark = _now()
            if op == BACKWARD_OP:
                self._steps += 1

    def pause(self) -> None:
        """A synchronising call starts: stop counting own time."""
        now = _now()
        if self._mark >= 0:
            self._own += now - self._mark
        self._mark = -1.0

    def resume(self, stepped: bool = False) -> None:
        """It ended: count own time again (``stepped``: a step ended)."""
        self._mark = _now()
        if self._since < 0:
            self._since = self._mark
        self._steps += stepped

    def take(self, rank: int, world_size: int) -> tuple[list[float], float]:
        """This rank's mean own time per step in its own slot (NaN without steps), and the
        wall time per step; resets."""
        self.pause()
        now = _now()
        slots = [0.0] * world_size
        slots[rank] = self._own / self._steps if self._steps else math.nan
        period = (now - self._since) / self._steps if self._steps and self._since >= 0 else 0.0
        self._own = 0.0
        self._steps = 0
        self._since = now
        return slots, period

    # --- riding on run.log's all-reduce ------------------------------------------------
    def log_extra(self) -> Sequence[float]:
        slots, self._period = self.take(self.rank, self.world_size)
        return slots

    def on_log_extra(self, means: list[float]) -> None:
        self.resume()
        if self.rank != 0:
            return
        report = straggler_report([m * self.world_size for m in means], self._period,
                                  self.threshold)
        if report is not None:
            self.last = report
            self.report(report.message())


@dataclass(frozen=True)
class StragglerReport:
    """Per-rank own time per step since the last ``run.log``, and the slowest rank."""

    times: tuple[float, ...]
    slowest: int
    period: float  # wall time per step (the same on every rank: they wait for each other)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def max(self) -> float:
        return self.times[self.slowest]

    def message(self) -> str:
        others = statistics.median(t for r, t in enumerate(self.times) if r != self.slowest)
        gap = self.max - others
        return (f"straggler: rank {self.slowest} is slowest; the others wait about {_ms(gap)} "
                f"for it every step ({100 * gap / self.period:.0f}% of a {_ms(self.period)} "
                f"step). Own time per step (outside backward and collectives) since the "
                f"last log, over {len(self.times)} ranks: min {_ms(self.min)} / median {_ms(self.median)} / "
                f"max {_ms(self.max)}.")


def straggler_report(summed: list[float], period: float, threshold: float,
                     min_gap: float = MIN_GAP_S) -> StragglerReport | None:
    """A report when the slowest rank's own time exceeds the others' median by
    ``threshold`` of the wall time per step (``period``) and by ``min_gap`` seconds; None
    otherwise, or when a rank had no steps."""
    times = tuple(summed)
    if len(times) < 2 or period <= 0 or not all(math.isfinite(t) for t in times):
        return None
    slowest = max(range(len(times)), key=times.__getitem__)
    others = statistics.median(t for r, t in enumerate(times) if r != slowest)
    gap = times[slowest] - others
    if gap < min_gap or gap <= threshold * period:
        return None
    return StragglerReport(times, slowest, period)


def _warn(message: str) -> None:
    get_logger().warning("%s", message)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
