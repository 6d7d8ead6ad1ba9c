"""A seeded bijection of [0, n) evaluated per index: a shuffle in O(1) memory.

A balanced Feistel network permutes [0, 4^h) for the smallest h with 4^h >= n; values that
land outside [0, n) are walked through the network again until they land inside
("cycle-walking"), which keeps it a bijection of [0, n). Since 4^h < 4n, a walk takes fewer
than four rounds trips on average. Indices are computed in vectorised int64 chunks, so an
epoch's order never exists as a whole: memory and epoch-start time do not depend on n.

The same values, computed three ways by cost. A round's function of the right half takes
only 2^h inputs, so each round is one table lookup (a table of 2^h entries a round, made
once per permutation, up to h = 16). For a small domain (4^h <= 2^16, so n <= 65536),
where an epoch is short and whatever its start costs shows in every batch, the whole walked
order is made at once (:func:`whole_orders`), for several epochs in one vectorised call,
the walk done by pointer doubling: the cost of a few tensor operations, spread over the
epochs. Above that, positions are computed a chunk at a time, as needed.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["Permutation", "EpochOrders", "whole_orders", "half_bits", "WHOLE_BITS"]

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_ROUNDS = 6
_TABLE_HALF = 16  # round tables up to 2^16 entries a round; above, each round computes
WHOLE_BITS = 16  # domains up to 2^16 get their whole walked order at once (512 KiB)
_BLOCK = 1 << 16  # values made per whole_orders call: epochs of a small domain together
_MAX_EPOCHS = 16  # ...but no more epochs ahead than this


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


def half_bits(n: int) -> int:
    """h: the network permutes [0, 4^h), the smallest such domain (at least 4) holding n."""
    bits = max(2, (max(n - 1, 1)).bit_length())
    return (bits + 1) // 2


def _round_keys(seed: int, epoch: int) -> list[int]:
    base = _splitmix64((seed & _M64) ^ _splitmix64(epoch & _M64))
    return [_splitmix64(base + r) & _M32 for r in range(_ROUNDS)]


def _tables(half: int, keys: torch.Tensor) -> torch.Tensor:
    """Round k's function at every right half r: ``_mix32(r ^ key_k) & mask``; keys (..., R)."""
    r = torch.arange(1 << half, dtype=torch.int64)
    return _mix32(r ^ keys.unsqueeze(-1)) & ((1 << half) - 1)


def whole_orders(n: int, seed: int, first: int, count: int) -> torch.Tensor:
    """``Permutation(n, seed, e)[i]`` for e in ``first..first+count-1`` and every i in
    [0, n): a (count, n) int64 tensor. For small domains only (``2 * h <= WHOLE_BITS``):
    memory is ``count * 4^h`` values."""
    half = half_bits(n)
    if 2 * half > WHOLE_BITS:
        raise ValueError(f"n={n}: whole orders are for n <= {1 << WHOLE_BITS}")
    m, size = 1 << half, 1 << (2 * half)
    keys = torch.tensor([_round_keys(seed, e) for e in range(first, first + count)],
                        dtype=torch.int64)
    # int32 throughout (values < 2^16 times count <= 16): half the memory traffic of int64,
    # and index_select takes int32 indices. All rows go through one flat table per round:
    # every half carries its row's offset, row * m, so it indexes the row's own table entries.
    tables = _tables(half, keys).to(torch.int32)  # (count, rounds, m)
    flat = tables.transpose(0, 1).reshape(_ROUNDS, count * m)
    r = torch.arange(m, dtype=torch.int32)
    row_m = torch.arange(count, dtype=torch.int32).mul_(m).view(count, 1, 1)
    # Round 1 over each row's (left, right) grid at once, x = left * m + right:
    # left <- right, right <- left ^ T1[right].
    left = (row_m + r.view(1, 1, m)).expand(count, m, m).reshape(-1)
    right = (r.view(1, m, 1) ^ tables[:, 0].unsqueeze(1)).add_(row_m).reshape(-1)
    for k in range(1, _ROUNDS):  # XOR with an h-bit table value keeps the row's offset
        left, right = right, left ^ flat[k].index_select(0, right)
    # One round trip of every value: left << h is row * 4^h + L * m, a flat index.
    jump = ((left << half) | (right & (m - 1))).view(count, size)
    return _walk(jump, n, size).to(torch.int64)


def _walk(jump: torch.Tensor, n: int, size: int) -> torch.Tensor:
    """Cycle-walking of every row's round trips ``jump`` (flat indices, row * size + value)
    by pointer doubling: each value's first arrival in [0, n), for the starts in [0, n).

    Values inside [0, n) stop there (their ``jump`` becomes themselves); each pass moves
    every walk still outside on by as many steps as it has taken, so a walk of length L
    ends after log2(L) passes. Only walks from [0, n) must end (they do: their cycles hold
    their start); cycles wholly outside never do and are not waited for."""
    count = jump.shape[0]
    base = torch.arange(count, dtype=jump.dtype).mul_(size).view(count, 1)
    starts = jump[:, :n].flatten().clone()  # the first trip from each start, kept
    jump[:, :n] = torch.arange(n, dtype=jump.dtype) + base
    flat, outside = jump.view(-1), jump[:, n:]
    for _ in range(3):  # walks of up to 8 steps, before any check (most end by then)
        outside.copy_(flat.index_select(0, outside.reshape(-1)).view(outside.shape))
    while True:
        got = flat.index_select(0, starts).view(count, n).sub_(base)
        if not n or int(got.max()) < n:
            return got
        outside.copy_(flat.index_select(0, outside.reshape(-1)).view(outside.shape))


class EpochOrders:
    """Whole orders of successive epochs of one (n, seed), made several epochs at a time
    (as many as fit in about 2^16 values, at most 16) and kept until an epoch outside them
    is asked for: an epoch's order costs a share of one vectorised call."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self.count = max(1, min(_MAX_EPOCHS, _BLOCK >> (2 * half_bits(n))))
        self._first = 0
        self._block: torch.Tensor | None = None

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's whole order, ``perm[i]`` for i in [0, n) (an int64 view; do not
        write to it)."""
        block, at = self._block, epoch - self._first
        if block is None or not 0 <= at < len(block):
            # from the epoch asked for onwards: passes go forwards (and resume anywhere)
            block = self._block = whole_orders(self.n, self.seed, epoch, self.count)
            self._first, at = epoch, 0
        return block[at]


class Permutation:
    """``perm[i]`` for i in [0, n): the same for every (n, seed, epoch), on every machine."""

    def __init__(self, n: int, seed: int, epoch: int = 0) -> None:
        if n < 0:
            raise ValueError(f"n={n}: a permutation needs n >= 0")
        self.n, self.seed, self.epoch = n, seed, epoch
        self.half = half_bits(n)
        self.mask = (1 << self.half) - 1
        self.keys = _round_keys(seed, epoch)
        self._table_rows: tuple[torch.Tensor, ...] | None = None  # made when first needed
        self._whole: torch.Tensor | None = None

    def _round_trip(self, x: torch.Tensor) -> torch.Tensor:
        left, right = x >> self.half, x & self.mask
        if self.half <= _TABLE_HALF:
            if self._table_rows is None:
                keys = torch.tensor(self.keys, dtype=torch.int64)
                self._table_rows = _tables(self.half, keys).unbind(0)
            for table in self._table_rows:
                left, right = right, left ^ table.index_select(0, right)
        else:
            for key in self.keys:
                left, right = right, left ^ (_mix32(right ^ key) & self.mask)
        return (left << self.half) | right

    def _walk_one(self, x: int) -> int:
        """Cycle-walk one value in plain Python: cheaper than tensor ops for a few values
        (and the definition the vectorised paths are tested against)."""
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
        if 2 * self.half <= WHOLE_BITS:
            if self._whole is None:
                self._whole = whole_orders(self.n, self.seed, self.epoch, 1)[0]
            return self._whole.index_select(0, idx)
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
