"""Straggler report: which rank makes the others wait, from the all-reduce ``run.log`` does.

In data-parallel training the gradient all-reduce makes every rank wait for the slowest,
so wall time per step is the same everywhere and hides the culprit. What differs is the
time each rank spends on its own between the synchronising calls: loading data, the
forward pass and the loss, i.e. outside ``run.backward`` and ``run.step``. Each rank
sums that time (two clock reads per step, no communication); ``run.log`` sends every
rank's mean per step in the slot of its rank, zeros elsewhere, inside the all-reduce it
already does, so rank 0 learns them all without another collective.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

__all__ = ["StepClock", "StragglerReport", "straggler_report", "DEFAULT_THRESHOLD",
           "MIN_GAP_S"]

DEFAULT_THRESHOLD = 0.25  # the others wait for the slowest rank a quarter of every step
MIN_GAP_S = 5e-3  # and at least 5 ms per step: below that it is scheduling noise


class StepClock:
    """Time spent outside ``run.backward``/``run.step`` and steps counted, since ``take``."""

    __slots__ = ("_mark", "_own", "_steps", "_since")

    def __init__(self) -> None:
        self._mark = -1.0  # paused until the first backward/step ends: setup is not a step
        self._own = 0.0
        self._steps = 0
        self._since = -1.0  # start of the window, for the wall time per step

    def pause(self) -> None:
        """A synchronising call starts (backward, step, log): stop counting own time."""
        now = time.perf_counter()
        if self._mark >= 0:
            self._own += now - self._mark
        self._mark = -1.0

    def resume(self, stepped: bool = False) -> None:
        """It ended: count own time again (``stepped``: an optimizer step ended)."""
        self._mark = time.perf_counter()
        if self._since < 0:
            self._since = self._mark
        self._steps += stepped

    def take(self, rank: int, world_size: int) -> tuple[list[float], float]:
        """This rank's mean own time per step in its own slot (NaN without steps), and the
        wall time per step; resets."""
        self.pause()
        now = time.perf_counter()
        slots = [0.0] * world_size
        slots[rank] = self._own / self._steps if self._steps else math.nan
        period = (now - self._since) / self._steps if self._steps and self._since >= 0 else 0.0
        self._own = 0.0
        self._steps = 0
        self._since = now
        return slots, period


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
                f"step). Time per step outside backward/step since the last log, over "
                f"{len(self.times)} ranks: min {_ms(self.min)} / median {_ms(self.median)} / "
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


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
