"""The run's data part: the loaders it made, the one being iterated, and epochs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from splitsync.data.loader import DeviceLoader, build_loader, loader_kwargs_from
from splitsync.observe import Observer, overriding

__all__ = ["Loaders"]


class Loaders:
    """Loaders made by ``run.loader`` (in order) and which one is active."""

    def __init__(self, rank: int, world_size: int, seed: int, device: torch.device) -> None:
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.device = device
        self.all: list[DeviceLoader] = []
        self.active: DeviceLoader | None = None  # the loader whose pass is under way
        self._kwargs: tuple[Observer, ...] = ()
        self._iter: tuple[Observer, ...] = ()
        self._epochs: tuple[Observer, ...] = ()
        self._on_epoch: tuple[Observer, ...] = ()
        self._on_batch: tuple[Observer, ...] = ()

    def set_observers(self, observers: Sequence[Observer]) -> None:
        self._kwargs = overriding(observers, "loader_kwargs")
        self._iter = overriding(observers, "on_loader_iter")
        self._epochs = overriding(observers, "epochs")
        self._on_epoch = overriding(observers, "on_epoch")
        self._on_batch = overriding(observers, "on_batch")
        for loader in self.all:
            self._watch_batches(loader)

    def _watch_batches(self, loader: Any) -> None:
        # Loaders compute a batch's sample ids only while someone listens.
        loader.on_batch = self._batch if self._on_batch else None

    def _batch(self, loader: Any, ids: list[int]) -> None:
        for obs in self._on_batch:
            obs.on_batch(loader, ids)

    def build(self, data: Dataset | DataLoader, batch_size: int | None, *, shuffle: bool,
              drop_last: bool, num_workers: int, collate_fn: Any,
              **extra: Any) -> DeviceLoader:
        """A loader over this rank's shard (see ``Run.loader``); streams get a StreamLoader."""
        from splitsync.data.stream.sources import is_stream

        if is_stream(data.dataset if isinstance(data, DataLoader) else data):
            return self._stream(data, batch_size, shuffle=shuffle, drop_last=drop_last,
                                num_workers=num_workers, collate_fn=collate_fn, **extra)
        if isinstance(data, DataLoader):
            kwargs = loader_kwargs_from(data)
            if kwargs.get("worker_init_fn") is None:
                kwargs.pop("worker_init_fn", None)
            kwargs.update(extra)
        else:
            if batch_size is None:
                raise TypeError("run.loader(dataset, batch_size=...) needs a per-process batch_size.")
            kwargs = dict(dataset=data, batch_size=batch_size, shuffle=shuffle,
                          drop_last=drop_last, num_workers=num_workers, collate_fn=collate_fn,
                          **extra)
        for obs in self._kwargs:
            kwargs = obs.loader_kwargs(kwargs)
        loader = build_loader(rank=self.rank, world_size=self.world_size, seed=self.seed,
                              device=self.device, on_iter=self._set_active, **kwargs)
        self.all.append(loader)
        self._watch_batches(loader)
        return loader

    def _stream(self, data: Any, batch_size: int | None, **kwargs: Any) -> Any:
        from splitsync.data.stream import build_stream_loader

        if isinstance(data, DataLoader):  # keep the DataLoader's own batching options
            batch_size = batch_size or data.batch_size
            kwargs.update(num_workers=data.num_workers, drop_last=data.drop_last,
                          collate_fn=kwargs["collate_fn"] or data.collate_fn)
            data = data.dataset
        if batch_size is None:
            raise TypeError("run.loader(stream, batch_size=...) needs a per-process batch_size.")
        loader = build_stream_loader(data, batch_size=batch_size, rank=self.rank,
                                     world_size=self.world_size, seed=self.seed,
                                     device=self.device, on_iter=self._set_active, **kwargs)
        self.all.append(loader)
        self._watch_batches(loader)
        return loader

    def _set_active(self, loader: DeviceLoader) -> None:
        self.active = loader
        for obs in self._iter:
            obs.on_loader_iter(loader)

    def epochs(self, n: int, start: int = 0) -> Iterator[int]:
        """Yield epoch numbers start..n-1, calling set_epoch on every loader first."""
        for obs in self._epochs:
            n = obs.epochs(start, n)
        for epoch in range(start, n):
            for loader in self.all:
                loader.set_epoch(epoch)
            for obs in self._on_epoch:
                obs.on_epoch(epoch)
            yield epoch
