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
from dataclasses import dataclass
from functools import cached_property

import torch

from splitsync.data.permute import Permutation

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

    def indices(self, lo: int, hi: int) -> torch.Tensor:
        """The dataset indices (int64) this rank's pass hands out at positions ``lo`` to ``hi``."""
        pos = self.global_positions(lo, hi)
        if not self.shuffle or not len(pos):
            return pos
        if self.order == "bijection":
            return self._permutation.at(pos)
        return self._randperm[pos]

    def __iter__(self) -> Iterator[int]:
        """Every index of the pass, in order, computed ``_CHUNK`` at a time."""
        for lo in range(0, self.num_samples, _CHUNK):
            yield from self.indices(lo, min(lo + _CHUNK, self.num_samples)).tolist()
