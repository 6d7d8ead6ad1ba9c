"""Which dataset indices one pass of a sharded sampler hands one rank, position by position.

A pass of :class:`~splitsync.data.loader.ShardSampler` is fixed when it begins: the dataset's
length, the seed, the epoch, the order ("bijection" or "randperm"), the global positions of
the epoch already consumed (``start``), the rank and the world size. :class:`PassOrder`
holds exactly that and answers, for any range of the rank's positions in the pass, the
indices it hands out there, in one vectorised call. The sampler iterates a pass through its
``PassOrder``, so a tool that asks the same object later (after the pass, even after the
sampler moved on to another epoch) gets the indices the pass really handed out.

Rank r reads global positions start+r, start+r+W, ... of the epoch's order (as
DistributedSampler does). Positions past the epoch's end are padding and wrap to ``q mod n``:
DistributedSampler's repeats, taken from position 0 of the epoch, whatever ``start`` is. So a
pass resumed mid-epoch at the same world size pads with the very samples an uninterrupted
pass pads with (wrapping within what remained, as before, picked other samples: a resumed
run's last batch then differed from the uninterrupted run's).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain

import torch

from splitsync.data.permute import WHOLE_BITS, EpochOrders, Permutation, half_bits, whole_orders

__all__ = ["PassOrder", "ORDERS"]

# "bijection": a seeded permutation computed per index (memory and epoch start flat in n);
# "randperm": torch.randperm's order, identical to torch's DistributedSampler (O(n) memory).
ORDERS = ("bijection", "randperm")
_CHUNK = 8192  # indices computed per call while iterating: vectorised, memory bounded


@dataclass(frozen=True)
class PassOrder:
    """One pass of one rank: ``indices(lo, hi)`` are the dataset indices at its positions
    ``lo`` to ``hi`` (0 is the pass's first sample on this rank, ``num_samples`` its end)."""

    n: int  # the dataset's length
    seed: int
    epoch: int
    shuffle: bool
    order: str  # one of ORDERS
    start: int  # global positions of the epoch consumed before this pass began
    rank: int
    world_size: int
    num_samples: int  # this rank's samples in the pass, padding included
    # Where a small dataset's bijection orders come from: its sampler's, which makes them
    # several epochs at a time for all its passes (None: the pass makes its own).
    orders: EpochOrders | None = field(default=None, compare=False, repr=False)

    @property
    def remaining(self) -> int:
        """Global positions of the epoch left for this pass (all ranks)."""
        return max(self.n - self.start, 0)

    @property
    def real(self) -> int:
        """This rank's positions in the pass that are not padding repeats."""
        stop = min(self.remaining, self.num_samples * self.world_size)
        return len(range(self.rank, stop, self.world_size))

    @property
    def padding(self) -> int:
        """Padded repeats at the end of this rank's pass (DistributedSampler's)."""
        return self.num_samples - self.real

    @cached_property
    def _permutation(self) -> Permutation:
        return Permutation(self.n, self.seed, self.epoch)

    @cached_property
    def _randperm(self) -> torch.Tensor:
        # the epoch's whole order, as DistributedSampler draws it: once per pass
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=g)

    def global_positions(self, lo: int, hi: int) -> torch.Tensor:
        """The epoch positions (0..n) of this rank's pass positions ``lo`` to ``hi``."""
        if not 0 <= lo <= hi <= self.num_samples:
            raise IndexError(f"positions {lo}..{hi} outside this pass's 0..{self.num_samples}")
        q = torch.arange(lo, hi, dtype=torch.int64) * self.world_size + self.rank + self.start
        if hi > self.real:  # the padded tail wraps to the epoch's first positions
            q = torch.remainder(q, self.n)
        return q

    @cached_property
    def _whole(self) -> torch.Tensor | None:
        """The epoch's whole shuffled order where it is at hand: randperm's, and the
        bijection's for a small dataset (see :mod:`splitsync.data.permute`); else None."""
        if self.order != "bijection":
            return self._randperm
        if 2 * half_bits(self.n) > WHOLE_BITS:
            return None
        orders = self.orders
        if orders is None or (orders.n, orders.seed) != (self.n, self.seed):
            return whole_orders(self.n, self.seed, self.epoch, 1)[0]  # this epoch alone
        return orders.order(self.epoch)

    def indices(self, lo: int, hi: int) -> torch.Tensor:
        """The dataset indices (int64) this rank's pass hands out at positions ``lo`` to ``hi``."""
        pos = self.global_positions(lo, hi)
        if not self.shuffle or not len(pos):
            return pos
        whole = self._whole
        if whole is not None:
            return whole.index_select(0, pos)
        return self._permutation.at(pos)

    def __iter__(self) -> Iterator[int]:
        """Every index of the pass, in order. Where the epoch's order is at hand (or there
        is no shuffle) the positions before the padded tail are one strided slice of it, as
        DistributedSampler takes them; else they are computed ``_CHUNK`` at a time."""
        whole = self._whole if self.shuffle else None
        if self.shuffle and whole is None:
            # chain over lists: the DataLoader's next() per index stays in C
            return chain.from_iterable(self._chunks())
        real, world = self.real, self.world_size
        first = self.start + self.rank
        stop = first + real * world
        head = whole[first:stop:world].tolist() if whole is not None else range(first, stop, world)
        if real == self.num_samples:
            return iter(head)
        return chain(head, self.indices(real, self.num_samples).tolist())  # the padded tail

    def _chunks(self) -> Iterator[list[int]]:
        for lo in range(0, self.num_samples, _CHUNK):
            yield self.indices(lo, min(lo + _CHUNK, self.num_samples)).tolist()
