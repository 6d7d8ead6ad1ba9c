"""The readers: each (rank, worker) pair reads a disjoint part of the stream's epoch.

An epoch's global order is fixed by (seed, epoch) alone, never by the world size: shards
in a seeded order, and inside each shard windows of ``buffer_size`` samples, each permuted
by its own seeded permutation. Positions are therefore "samples consumed per shard", and
any world size can continue from them:

* shard-level: reader j of R takes shards j, j+R, ... of the epoch's shard order;
* element-level: every reader walks the whole order, which is cut into global batches of
  ``batch_size``; reader j keeps global batches j, j+R, ... The ranks step together, so
  what they have consumed is always a prefix of the order.

Each batch carries which positions of which shard its samples are (``(shard, first,
count)`` runs), so the main process knows the exact per-shard position of what was trained.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from splitsync.data.permute import Permutation
from splitsync.data.stream.sources import Source

__all__ = ["Layout", "choose_layout", "StreamReaders", "window_shuffled"]


@dataclass(frozen=True)
class Layout:
    """How ``n_shards`` shards are dealt to ``readers`` = ranks x workers, and why."""

    mode: str  # "shard" or "element"
    n_shards: int
    readers: int

    def describe(self, kind: str, world: int, workers: int) -> str:
        who = f"{world} rank(s) x {workers} worker(s) = {self.readers} reader(s)"
        if self.mode == "shard":
            return (f"run.loader: {kind} with {self.n_shards} shard(s) over {who}: shard-level, "
                    f"each reader opens {self.n_shards // self.readers} shard(s) of its own")
        return (f"run.loader: {kind} with {self.n_shards} shard(s) over {who}: element-level "
                f"(the shards do not divide evenly among the readers), so every reader reads "
                f"the whole stream and keeps one batch in {self.readers}: {self.readers}x the "
                "reading of shard-level. Use a shard count that is a multiple of the readers "
                "to read each shard once.")


def choose_layout(n_shards: int, world: int, workers: int) -> Layout:
    readers = world * max(1, workers)
    mode = "shard" if n_shards % readers == 0 else "element"
    return Layout(mode, n_shards, readers)


def _seed(*parts: int) -> int:
    h = 0x9E3779B9
    for p in parts:
        h = (h * 1000003 + p + 1) & 0x7FFFFFFFFFFFFFFF
    return h


def window_shuffled(source: Source, shard: int, start: int, window: int, seed: int,
                    epoch: int) -> Iterator[Any]:
    """Shard ``shard`` in its epoch order, from position ``start`` of that order.

    Windows are permuted independently, so resuming re-reads at most one window.
    """
    if window <= 1:
        yield from source.open_epoch(shard, start, seed, epoch)
        return
    first = start // window
    raw = source.open_epoch(shard, first * window, seed, epoch)
    block = first
    drop = start - first * window
    while True:
        items = list(islice(raw, window))
        if not items:
            return
        g = torch.Generator().manual_seed(_seed(seed, epoch, shard, block))
        order = torch.randperm(len(items), generator=g).tolist()
        for i in order[drop:]:
            yield items[i]
        drop = 0
        block += 1


class StreamReaders(IterableDataset):
    """Yields ``(batch, per-shard counts)`` for this process's reader; runs inside workers."""

    def __init__(self, source: Source, *, batch_size: int, drop_last: bool, shuffle: bool,
                 buffer_size: int, seed: int, rank: int, world: int, workers: int,
                 collate: Callable[[list[Any]], Any]) -> None:
        self.source = source
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.window = buffer_size if shuffle else 1
        self.seed = seed
        self.rank = rank
        self.world = world
        self.workers = max(1, workers)
        self.collate = collate
        self.layout = choose_layout(source.n_shards, world, workers)
        self.epoch = 0
        self.offsets = [0] * source.n_shards  # samples consumed per shard, epoch order
        self.rotation = 0  # worker shift that keeps a same-size resume bit-exact

    def shard_order(self) -> list[int]:
        n = self.source.n_shards
        if not self.shuffle:
            return list(range(n))
        return list(Permutation(n, _seed(self.seed, 7), self.epoch).iter_positions(0, n, 1))

    def reader(self) -> int:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        return ((worker + self.rotation) % self.workers) * self.world + self.rank

    def _runs(self, shards: list[int]) -> Iterator[tuple[int, Iterator[Any]]]:
        """(shard, its samples in epoch order from its offset) for ``shards`` in turn."""
        for s in shards:
            yield s, window_shuffled(self.source, s, self.offsets[s], self.window, self.seed,
                                     self.epoch)

    def __iter__(self) -> Iterator[tuple[Any, list[tuple[int, int, int]]]]:
        j, r = self.reader(), self.layout.readers
        order = self.shard_order()
        if self.layout.mode == "shard":
            return self._batches(self._runs(order[j::r]), j, 1)
        return self._batches(self._runs(order), j, r)

    def _batches(self, runs: Iterator[tuple[int, Iterator[Any]]], j: int, r: int
                 ) -> Iterator[tuple[Any, list[tuple[int, int, int]]]]:
        """Batches of ``batch_size`` over the concatenated runs, keeping global batches
        j, j+r, ... (r=1: all). Counts per shard are kept per run, not per sample."""
        b = self.batch_size
        items: list[Any] = []
        counts: list[tuple[int, int, int]] = []  # (shard, first position, samples)
        index = skipped = 0  # global batch number; samples of another reader's batch read
        for s, samples in runs:
            taken = 0  # samples of shard s in the current batch
            pos = self.offsets[s]  # position in shard s's epoch order of the next sample
            for x in samples:
                pos += 1
                if r > 1 and index % r != j:  # another reader's batch: read past it
                    skipped += 1
                    if skipped == b:
                        skipped, index = 0, index + 1
                    continue
                items.append(x)
                taken += 1
                if len(items) == b:
                    counts.append((s, pos - taken, taken))
                    yield self.collate(items), counts
                    items, counts, taken, index = [], [], 0, index + 1
            if taken:
                counts.append((s, pos - taken, taken))
        if items and not self.drop_last:
            yield self.collate(items), counts
