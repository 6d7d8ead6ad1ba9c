"""``run.loader(dataset, batch_size, sampler=s)``: a sampler of the user's own (weighted,
length-grouped, a subset), dealt out over the ranks and resumable like splitsync's own.

The user's sampler gives the epoch's *global* order of dataset indices. splitsync draws it
on every rank, with torch's and Python's generators seeded from (seed, epoch) for the draw
(so ``RandomSampler``, ``WeightedRandomSampler`` and samplers drawing from the global
generators agree across ranks and restarts), after calling its ``set_epoch(epoch)`` if it
has one. It then deals the order out round-robin as :class:`ShardSampler` deals its own:
rank r reads positions r, r+W, ...; a checkpoint keeps the positions consumed, and a resume
draws the epoch's order again and skips them, at any world size. The order is drawn twice
per epoch and must come out the same: a sampler whose order also depends on something
else (a generator of its own that is not reseeded in ``set_epoch``) is refused, since its
ranks would read overlapping samples and a resume would read others.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Any

import torch

from splitsync.data.loader import ShardSampler
from splitsync.data.order import PassOrder

__all__ = ["SamplerShards", "DrawnOrder"]


@dataclass(frozen=True)
class DrawnOrder(PassOrder):
    """A pass over positions of a drawn order: position p hands out ``drawn[p]``."""

    drawn: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64),
                                compare=False, repr=False)

    def indices(self, lo: int, hi: int) -> torch.Tensor:
        return self.drawn[super().indices(lo, hi)]

    def __iter__(self) -> Iterator[int]:
        # through indices(): PassOrder's fast path slices its own order, not the drawn one
        return chain.from_iterable(self._chunks())


class _Positions:
    """What the base sampler deals out: the positions of the drawn order (only its length)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class SamplerShards(ShardSampler):
    """:class:`ShardSampler` over the order a user's sampler draws (see the module)."""

    def __init__(self, sampler: Any, dataset_len: int, *, num_replicas: int, rank: int,
                 seed: int, drop_last: bool = False) -> None:
        try:
            n = len(sampler)
        except TypeError:
            raise TypeError(f"run.loader(..., sampler={type(sampler).__name__}): the sampler "
                            "needs a length (__len__), the number of indices it yields per "
                            "epoch.") from None
        super().__init__(_Positions(n), num_replicas, rank, shuffle=False, seed=seed,
                         drop_last=drop_last)
        self.user_sampler = sampler
        self.dataset_len = dataset_len
        self._drawn: tuple[int, torch.Tensor] | None = None
        self._wrapped: tuple[PassOrder, DrawnOrder] | None = None

    def _draw(self) -> torch.Tensor:
        set_epoch = getattr(self.user_sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        state = random.getstate()
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed + self.epoch)
                random.seed(self.seed + self.epoch)
                return torch.as_tensor(list(self.user_sampler), dtype=torch.int64)
        finally:
            random.setstate(state)

    def drawn(self) -> torch.Tensor:
        """This epoch's global order of dataset indices (drawn once per epoch)."""
        if self._drawn is not None and self._drawn[0] == self.epoch:
            return self._drawn[1]
        name = type(self.user_sampler).__name__
        order, again = self._draw(), self._draw()
        if order.dim() != 1:
            raise TypeError(f"run.loader(..., sampler={name}): it yields {tuple(order.shape)} "
                            "items; a sampler yields one dataset index at a time (a batch "
                            "sampler cannot be dealt out over ranks).")
        if len(order) != self.num_positions:
            raise ValueError(f"run.loader(..., sampler={name}): it yielded {len(order)} "
                             f"indices where its length says {self.num_positions}.")
        if len(order) and not (0 <= int(order.min()) and int(order.max()) < self.dataset_len):
            raise ValueError(f"run.loader(..., sampler={name}): it yields indices outside the "
                             f"dataset's 0..{self.dataset_len - 1}.")
        if not torch.equal(order, again):
            raise ValueError(
                f"run.loader(..., sampler={name}): drawn twice for epoch {self.epoch}, its "
                "order differed, so the ranks would not agree on it and a resume would "
                "read other samples. Make it depend only on the epoch: draw from torch's "
                "global generator (splitsync seeds it from the seed and the epoch for the "
                "draw), or reseed a generator of its own in set_epoch(epoch).")
        self._drawn = (self.epoch, order)
        return order

    @property
    def num_positions(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def global_order(self) -> list[int]:
        return self.drawn().tolist()

    def pass_order(self) -> PassOrder:
        base = super().pass_order()
        if self._wrapped is None or self._wrapped[0] is not base:
            values = {f.name: getattr(base, f.name) for f in fields(PassOrder)}
            self._wrapped = (base, DrawnOrder(**values, drawn=self.drawn()))
        return self._wrapped[1]
