"""A seeded bijection of [0, n) evaluated per index: a shuffle in O(1) memory.

A balanced Feistel network permutes [0, 4^h) for the smallest h with 4^h >= n; values that
land outside [0, n) are walked through the network again until they land inside
("cycle-walking"), which keeps it a bijection of [0, n). Since 4^h < 4n, a walk takes fewer
than four rounds trips on average. Indices are computed in vectorised int64 chunks, so an
epoch's order never exists as a whole: memory and epoch-start time do not depend on n.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["Permutation"]

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_ROUNDS = 6


def _splitmix64(x: int) -> int:
    """Well-mixed 64-bit key material from (seed, epoch, round)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # Products stay below 2^59: 32-bit values times 27-bit constants never overflow int64.
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


class Permutation:
    """``perm[i]`` for i in [0, n): the same for every (n, seed, epoch), on every machine."""

    def __init__(self, n: int, seed: int, epoch: int = 0) -> None:
        if n < 0:
            raise ValueError(f"n={n}: a permutation needs n >= 0")
        self.n = n
        bits = max(2, (max(n - 1, 1)).bit_length())
        self.half = (bits + 1) // 2
        self.mask = (1 << self.half) - 1
        base = _splitmix64((seed & _M64) ^ _splitmix64(epoch & _M64))
        self.keys = [_splitmix64(base + r) & _M32 for r in range(_ROUNDS)]

    def _round_trip(self, x: torch.Tensor) -> torch.Tensor:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix32(right ^ key) & self.mask)
        return (left << self.half) | right

    def _walk_one(self, x: int) -> int:
        """Cycle-walk one value in plain Python: cheaper than tensor ops for a few values."""
        h, m = self.half, self.mask
        while True:
            left, right = x >> h, x & m
            for key in self.keys:
                v = right ^ key
                v ^= v >> 16
                v = (v * 0x45D9F3B) & _M32
                v ^= v >> 16
                v = (v * 0x45D9F3B) & _M32
                v ^= v >> 16
                left, right = right, left ^ (v & m)
            x = (left << h) | right
            if x < self.n:
                return x

    def at(self, idx: torch.Tensor) -> torch.Tensor:
        """The permuted values of the int64 positions ``idx`` (each in [0, n))."""
        out = self._round_trip(idx)
        # index_select/index_copy_: boolean-mask indexing is ~50x slower on CPU here
        where = (out >= self.n).nonzero().squeeze(1)
        while where.numel() > 64:
            out.index_copy_(0, where, self._round_trip(out.index_select(0, where)))
            where = where[out.index_select(0, where) >= self.n]
        if where.numel():  # the walk's thin tail: per value in plain Python
            vals = [self._walk_one(v) for v in out.index_select(0, where).tolist()]
            out.index_copy_(0, where, torch.tensor(vals, dtype=torch.int64))
        return out

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"position {i} outside [0, {self.n})")
        return int(self.at(torch.tensor([i], dtype=torch.int64))[0])

    def __len__(self) -> int:
        return self.n

    def iter_positions(self, start: int, stop: int, step: int, chunk: int = 8192
                       ) -> Iterator[int]:
        """perm[p] for p in range(start, stop, step), computed ``chunk`` at a time."""
        span = chunk * step
        for lo in range(start, stop, span):
            pos = torch.arange(lo, min(lo + span, stop), step, dtype=torch.int64)
            yield from self.at(pos).tolist()
