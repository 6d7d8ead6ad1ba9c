"""A map-style loader's passes as the ledger follows them: counts per step, ids at writes.

Which samples a pass of ``run.loader`` over an indexable dataset delivers is fixed when the
pass begins: the sampler's :class:`~splitsync.data.order.PassOrder` (the object its own
iteration reads) gives the index at every position of the rank's pass, and batch k holds
positions ``k * batch_size`` to ``(k + 1) * batch_size``. So the ledger needs no call per
batch: at a step it reads how many batches the pass has yielded (``loader.batches_seen``)
and keeps a range of positions, ``[order, lo, hi]``; the ids are computed from the ranges
only when they are written, one vectorised call per pass order.
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
                 "credited", "seg")

    def __init__(self, loader: Any, idx: int, order: PassOrder) -> None:
        self.loader = loader
        self.idx = idx  # the ledger's number for the loader
        self.order = order
        self.epoch = order.epoch
        self.size = loader.batch_size or 1
        self.total = order.num_samples
        self.real = order.real  # positions from here to total are padding repeats
        self.number = loader.passes  # which pass of the loader (see previous_pass_batches)
        self.credited = 0
        self.seg: list[Any] | None = None  # its open [order, lo, hi], extended step by step

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
