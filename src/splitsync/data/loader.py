"""Sharded, resumable data loading: every rank reads its own part, batches arrive on device."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sized
from itertools import chain, islice
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
)

from splitsync.data.order import ORDERS, PassOrder
from splitsync.data.permute import EpochOrders
from splitsync.distributed.device import move_to

__all__ = ["ShardSampler", "DeviceLoader", "loader_kwargs_from", "ORDERS", "PassOrder",
           "LoaderHooks", "direct"]


def direct(op: str, fn: Callable[..., Any], *args: Any) -> Any:
    """A collective run as it is (no observer watches collectives)."""
    return fn(*args)


class LoaderHooks:
    """What the loaders of one run call back into, updated when the run's observers change:
    the observers to tell of a new pass, those that adjust loader arguments, how to run a
    collective (through the observers' ``around_collective``), and the loader being iterated.
    The loaders call observers directly, so no call goes back up into the run."""

    # A plain class, not a frozen dataclass: the run replaces its fields when observers
    # change, and every loader already made sees the change through the one object.
    def __init__(self) -> None:
        self.on_iter: tuple[Any, ...] = ()  # observers overriding on_loader_iter
        self.on_batch: tuple[Any, ...] = ()  # observers overriding on_batch (ids computed
        # only while there are some)
        self.on_stream_batch: tuple[Any, ...] = ()  # those overriding on_stream_batch
        self.adjust: tuple[Any, ...] = ()  # observers overriding loader_kwargs
        self.collective: Callable[..., Any] = direct
        self.active: Any = None  # the loader whose pass is under way
        # set by a resume whose global RNG states wait for the next training step: called
        # at a pass's first batch (see splitsync.distributed.rng)
        self.arrival: Callable[[], None] | None = None


class ShardSampler(DistributedSampler):
    """DistributedSampler that can start mid-epoch, also at another world size.

    Rank r reads positions r, r+W, r+2W, ... of the epoch's global order (as
    DistributedSampler does), so after every rank has read n samples exactly the first
    n*W positions are consumed. Resuming skips those positions by index, without
    reading any data, and deals the rest out over the new world size.

    ``order="randperm"`` (the default here) reproduces DistributedSampler's order exactly and,
    like it, holds the epoch's permutation in memory; ``order="bijection"`` (what
    ``run.loader`` uses) computes each position's index on the fly with a seeded Feistel
    permutation, so memory and epoch-start time do not grow with the dataset.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int,
        rank: int,
        shuffle: bool,
        seed: int,
        drop_last: bool = False,
        *,
        order: str = "randperm",
    ) -> None:
        if order not in ORDERS:
            raise ValueError(f"order={order!r}: choose one of {ORDERS}.")
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
            drop_last=drop_last,
        )
        self.order = order
        self.start = 0  # global positions of this epoch already consumed
        self._resume_epoch: int | None = None
        # When set, every index handed out is also kept here (in the main process, where
        # the DataLoader draws indices), so a loader can say which samples a batch holds.
        self.tap: IndexTap | None = None
        self._pass: PassOrder | None = None  # the current pass's order, made when asked
        self._orders: EpochOrders | None = None  # a small dataset's orders, epochs ahead
        self._set_sizes()

    def _set_sizes(self) -> None:
        remaining = len(self.dataset) - self.start  # type: ignore[arg-type]
        world = self.num_replicas
        self.num_samples = remaining // world if self.drop_last else math.ceil(remaining / world)
        self.total_size = self.num_samples * world

    def global_order(self) -> list[int]:
        """The epoch's order over the whole dataset (same on every rank); O(n), for inspection."""
        n = len(self.dataset)  # type: ignore[arg-type]
        whole = PassOrder(n, self.seed, self.epoch, self.shuffle, self.order, 0, 0, 1, n)
        return whole.indices(0, n).tolist()

    def pass_order(self) -> PassOrder:
        """The pass this sampler hands out now (its epoch, its start, this rank): what
        iterating it yields, position by position. One object per pass, shared with the
        iteration, so the indices it gives later are the ones the pass handed out."""
        cur, n = self._pass, len(self.dataset)  # type: ignore[arg-type]
        if (cur is None or cur.epoch != self.epoch or cur.start != self.start or cur.n != n
                or cur.num_samples != self.num_samples):
            orders = self._orders
            if orders is None or (orders.n, orders.seed) != (n, self.seed):
                orders = self._orders = EpochOrders(n, self.seed)
            cur = self._pass = PassOrder(n, self.seed, self.epoch, self.shuffle, self.order,
                                         self.start, self.rank, self.num_replicas,
                                         self.num_samples, orders)
        return cur

    def __iter__(self) -> Iterator[int]:
        order = iter(self.pass_order())
        if self.tap is not None:  # to the tap a chunk at a time: no per-index Python of ours
            return chain.from_iterable(self.tap.feed(order))
        return order

    def __len__(self) -> int:
        return self.num_samples

    @property
    def padding(self) -> int:
        """Number of padded (repeated) samples this rank reads at the end of the epoch."""
        if self.drop_last:
            return 0
        remaining = len(self.dataset) - self.start  # type: ignore[arg-type]
        real = len(range(self.rank, remaining, self.num_replicas))
        return self.num_samples - real

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; a pending resume position applies only to its own epoch."""
        super().set_epoch(epoch)
        if self._resume_epoch != epoch:
            self.start = 0
        self._resume_epoch = None
        self._set_sizes()

    def resume_at(self, epoch: int, consumed: int) -> None:
        """Continue ``epoch`` after ``consumed`` global positions (any world size)."""
        self.epoch = epoch
        self.start = min(consumed, len(self.dataset))  # type: ignore[arg-type]
        self._resume_epoch = epoch
        self._set_sizes()


class IndexTap:
    """The indices a sampler handed out, in order, taken back a batch at a time."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self.at = 0  # the next index to take

    def feed(self, indices: Iterator[int], chunk: int = 4096) -> Iterator[list[int]]:
        """``indices`` in lists of up to ``chunk``, each kept here as it is handed out.

        Lists start small and double: a pass read only in part (a short pass, a resume)
        draws few indices it never uses, and a long pass still pays per chunk, not per index.
        """
        size = 64
        while True:
            values = list(islice(indices, size))
            size = min(size * 2, chunk)
            if not values:
                return
            if self.at > 65536:  # drop what was taken, now and then (C-speed)
                del self.items[: self.at]
                self.at = 0
            self.items.extend(values)
            yield values


class DeviceLoader:
    """A DataLoader whose batches arrive on the run's device and whose position is known."""

    # What the sample ledger and the audit read (``run.loader(..., train=, repeats=)``):
    # None: not said (an evaluation is then inferred where certain), False: evaluation.
    train: bool | None = None
    repeats = 1  # times the sampler delivers each sample per epoch by design

    def __init__(self, loader: DataLoader, device: torch.device, world_size: int,
                 hooks: LoaderHooks | None = None) -> None:
        self.loader = loader
        self.hooks = hooks
        self.device = device
        self.world_size = world_size
        self.batches_seen = 0  # in the current pass
        self.last_batch = False
        # Passes begun, and the batches the one before the current pass yielded: with the
        # sampler's pass_order, which samples any pass delivered, no per-batch bookkeeping.
        self.passes = 0
        self.previous_pass_batches = 0
        self.exhausted = False  # the current pass ran out of batches
        self._cpu = device.type == "cpu"
        # Where the current pass began, for checkpoints: a mid-pass resume must restore the
        # generator to this state so the new iterator draws the same worker base seed.
        self.pass_epoch: int | None = None
        self.pass_generator_state: torch.Tensor | None = None

    @property
    def sampler(self) -> ShardSampler | None:
        s = self.loader.sampler
        return s if isinstance(s, ShardSampler) else None

    @property
    def dataset(self) -> Dataset:
        return self.loader.dataset

    @property
    def batch_size(self) -> int | None:
        return self.loader.batch_size

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def length(self) -> int | None:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def consumed(self) -> int:
        """Global positions of the current epoch consumed so far."""
        s = self.sampler
        per_rank = self.batches_seen * (self.loader.batch_size or 1)
        start = s.start if s is not None else 0
        total = len(s.dataset if s is not None else self.dataset)  # type: ignore[arg-type]
        return start + min(per_rank * self.world_size, total - start)

    def __iter__(self) -> Iterator[Any]:
        if self.hooks is not None and self.hooks.arrival is not None:
            self.hooks.arrival()  # a resume's RNG states: before this pass draws anything
        self.previous_pass_batches, self.batches_seen = self.batches_seen, 0
        self.passes += 1
        self.last_batch = False
        self.exhausted = False
        gen = self.loader.generator
        self.pass_epoch = self.sampler.epoch if self.sampler is not None else 0
        self.pass_generator_state = gen.get_state() if gen is not None else None
        hooks = self.hooks
        if hooks is not None:  # the active loader, and observers told: no call back up
            hooks.active = self
            for obs in hooks.on_iter:
                obs.on_loader_iter(self)
        total = len(self.loader)
        if hooks is not None and hooks.on_batch and self.sampler is not None:
            yield from self._iter_with_ids(total, hooks.on_batch)
            return
        self.exhausted = False
        for batch in self.loader:
            self.batches_seen += 1
            self.last_batch = self.batches_seen == total
            yield batch if self._cpu else move_to(batch, self.device)
        self.exhausted = True  # the pass ran out (the loop asked for a batch past the last)

    def _iter_with_ids(self, total: int, observers: tuple[Any, ...]) -> Iterator[Any]:
        """The pass, telling ``observers`` each batch's indices (``on_batch``). The
        DataLoader draws indices in order (ahead, with workers) and returns batches in that
        order, so batch k holds the k-th ``batch_size`` indices drawn."""
        sampler = self.sampler
        assert sampler is not None
        if self.loader.num_workers and not getattr(self.loader, "in_order", True):
            raise ValueError("run.loader(..., in_order=False) returns batches out of order, so "
                             "their sample indices are unknown; drop in_order=False to record "
                             "them.")
        tap = sampler.tap = IndexTap()
        size = self.loader.batch_size or 1
        last = len(sampler) - (total - 1) * size if not self.loader.drop_last else size
        try:
            for batch in self.loader:
                self.batches_seen += 1
                self.last_batch = self.batches_seen == total
                # the batch's indices, taken from the tap inline: a call costs more than this
                at, k = tap.at, last if self.last_batch else size
                ids = tap.items[at : at + k]
                tap.at = at + k
                for obs in observers:
                    obs.on_batch(self, ids)
                yield batch if self._cpu else move_to(batch, self.device)
            self.exhausted = True
        finally:
            sampler.tap = None

    def trim_padding(self, x: torch.Tensor) -> torch.Tensor:
        """Drop this rank's padded duplicates from the current batch's results."""
        s = self.sampler
        if not self.last_batch or s is None or s.padding == 0:
            return x
        return x[: x.shape[0] - s.padding]

    # --- position (the protocol shared with the stream loader) ----------------------------
    def _mid_pass(self) -> bool:
        s = self.sampler
        epoch = s.epoch if s is not None else 0
        return self.pass_epoch == epoch and 0 < self.batches_seen < len(self)

    def position(self) -> dict[str, Any]:
        """(epoch, global positions consumed) to continue from: the next epoch once this
        one is done, the sampler's start before it has begun."""
        s = self.sampler
        epoch = s.epoch if s is not None else 0
        if self.pass_epoch != epoch or self.batches_seen == 0:  # this epoch not begun yet
            return {"epoch": epoch, "consumed": s.start if s is not None else 0}
        if self.batches_seen >= len(self):  # epoch finished: continue at the next one
            return {"epoch": epoch + 1, "consumed": 0}
        return {"epoch": epoch, "consumed": self.consumed()}

    def rng_state(self) -> torch.Tensor | None:
        """Mid-pass: the generator's state *before* the pass began, so the resumed iterator
        draws the same worker base seed as the interrupted one did; else its state now."""
        if self._mid_pass():
            return self.pass_generator_state
        gen = self.loader.generator
        return gen.get_state() if gen is not None else None

    def restore(self, pos: Mapping[str, Any], rng_state: torch.Tensor | None = None) -> None:
        """Continue at ``pos``: positions already consumed are skipped by index."""
        if "offsets" in pos:
            raise ValueError("the checkpoint holds a stream loader's position where this run "
                             "made an indexed loader; make loaders in the same order.")
        s = self.sampler
        if s is None:
            raise ValueError("cannot resume a loader without splitsync's ShardSampler; build "
                             "it with run.loader().")
        s.resume_at(int(pos["epoch"]), int(pos["consumed"]))
        gen = self.loader.generator
        if gen is not None and rng_state is not None:
            gen.set_state(rng_state)


_PASSTHROUGH = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
    "prefetch_factor", "persistent_workers", "multiprocessing_context", "in_order",
)


def loader_kwargs_from(loader: DataLoader) -> dict[str, Any]:
    """Rebuild arguments from an existing DataLoader's public attributes."""
    bs = loader.batch_sampler
    if loader.batch_size is None or (bs is not None and type(bs) is not BatchSampler):
        raise ValueError(
            f"Cannot re-shard a DataLoader with a custom batch_sampler ({type(bs).__name__}): "
            "splitsync would not know how to split it across ranks. Pass the dataset to "
            "run.loader(dataset, batch_size=...) instead, or shard the batch sampler yourself."
        )
    sampler = loader.sampler
    if isinstance(sampler, RandomSampler):
        shuffle = True
    elif isinstance(sampler, (SequentialSampler, DistributedSampler)):
        shuffle = bool(getattr(sampler, "shuffle", False))
    else:  # the user's own order: dealt out over the ranks (splitsync.data.custom)
        shuffle = False
    kwargs: dict[str, Any] = {
        "dataset": loader.dataset, "batch_size": loader.batch_size, "shuffle": shuffle,
        "drop_last": loader.drop_last,
    }
    if not isinstance(sampler, (RandomSampler, SequentialSampler, DistributedSampler)):
        kwargs["sampler"] = sampler
    for name in _PASSTHROUGH:
        if hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)
        kwargs.pop("persistent_workers", None)
    return kwargs
