"""A map-style loader's passes as the ledger follows them: counts per step, ids at writes.

Which samples a pass of ``run.loader`` over an indexable dataset delivers is fixed when the
pass begins: the sampler's :class:`~splitsync.data.order.PassOrder` (the object its own
iteration reads) gives the index at every position of the rank's pass, and batch k holds
positions ``k * batch_size`` to ``(k + 1) * batch_size``. So the ledger needs no call per
batch: at a step it reads how many batches the pass has yielded (``loader.batches_seen``)
and keeps a range of positions, ``[order, lo, hi]``; the ids are computed from the ranges
only when they are written, one vectorised call per pass order. Consecutive steps that
each take as many samples of one pass (nearly all of them) are kept as a run: a step that
extends it stores three numbers, and the run's table rows are made when it ends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from splitsync.data.order import PassOrder

__all__ = ["MapPass", "ids_of"]


class MapPass:
    """One pass: its order, and how many of its samples (positions 0 to ``credited``) have
    gone to steps so far."""

    __slots__ = ("loader", "idx", "order", "epoch", "size", "total", "real", "number",
                 "credited", "seg", "run_first", "run_last", "run_n", "next", "calls")

    def __init__(self, loader: Any, idx: int, order: PassOrder, calls: int = 0) -> None:
        self.loader = loader
        self.calls = calls  # run.step calls (micro-steps too) before the pass began
        self.idx = idx  # the ledger's number for the loader
        self.order = order
        self.epoch = order.epoch
        self.size = loader.batch_size or 1
        self.total = order.num_samples
        self.real = order.real  # positions from here to total are padding repeats
        self.number = loader.passes  # which pass of the loader (see previous_pass_batches)
        self.credited = 0
        self.seg: list[Any] | None = None  # its open [order, lo, hi], extended step by step
        # The open run: steps run_first to run_last took run_n samples each (no padding),
        # and nothing else of this loader; its rows are made only when it ends (close_run).
        self.run_first = self.run_last = -2  # -2: no open run
        self.run_n = 0
        self.next = -1  # credited + run_n while a run is open: where a step extends it to

    def open_run(self, step: int, n: int) -> None:
        """``step`` took the last ``n`` positions credited: a run begins with it."""
        self.run_first = self.run_last = step
        self.run_n = n
        self.next = self.credited + n

    def close_run(self, rows: list[int]) -> int:
        """Append the open run's rows (step, epoch, run_n, 0 each) to ``rows`` and end it;
        returns the samples its steps after the first took (the first was counted)."""
        if self.run_last < 0:
            return 0
        e, n = self.epoch, self.run_n
        for step in range(self.run_first, self.run_last + 1):
            rows += (step, e, n, 0)
        assert self.seg is not None
        self.seg[2] = self.credited  # the run grew the range without touching it
        grown = (self.run_last - self.run_first) * n
        self.run_first = self.run_last = -2
        return grown

    def delivered(self, batches: int) -> int:
        """Samples of the pass in its first ``batches`` batches."""
        return min(batches * self.size, self.total)

    def padded(self, lo: int, hi: int) -> int:
        """How many of positions ``lo`` to ``hi`` are padding repeats (all at the end)."""
        return hi - max(lo, self.real) if hi > self.real else 0


def ids_of(segs: list[list[Any]], total: int) -> np.ndarray:
    """The ids (int64) of the first ``total`` positions of the ranges ``segs``, in order;
    those leave ``segs`` (a range cut in two keeps its rest). One call per pass order, since
    the passes of one epoch share theirs, then slices."""
    cut, k = [], 0
    while total > 0:
        order, lo, hi = segs[k]
        take = min(hi - lo, total)
        cut.append((order, lo, lo + take))
        total -= take
        if take < hi - lo:  # the rest waits for the step it belongs to
            segs[k] = [order, lo + take, hi]
        else:
            k += 1
    del segs[:k]
    spans: dict[int, tuple[PassOrder, int, int]] = {}
    for order, lo, hi in cut:
        _, a, b = spans.get(id(order), (order, lo, hi))
        spans[id(order)] = (order, min(a, lo), max(b, hi))
    whole = {key: (a, order.indices(a, b).numpy()) for key, (order, a, b) in spans.items()}
    parts = [whole[id(o)][1][lo - whole[id(o)][0]:hi - whole[id(o)][0]] for o, lo, hi in cut]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
