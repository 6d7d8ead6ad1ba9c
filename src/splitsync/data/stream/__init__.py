"""Streams for ``run.loader``: sharded per rank and worker, exactly resumable at any world size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from splitsync.data.stream.loader import AT_END, StreamLoader
from splitsync.data.stream.readers import Layout, StreamReaders, choose_layout
from splitsync.data.stream.sources import Shards, Source, as_source, is_stream
from splitsync.dist.seeding import loader_seed, worker_init_fn

__all__ = ["Shards", "Source", "StreamLoader", "Layout", "choose_layout", "is_stream",
           "build_stream_loader", "AT_END", "DEFAULT_BUFFER"]

DEFAULT_BUFFER = 1024
_REFUSED = ("sampler", "batch_sampler", "persistent_workers")


def build_stream_loader(data: Any, *, batch_size: int, shuffle: bool, drop_last: bool,
                        num_workers: int, collate_fn: Callable[[list[Any]], Any] | None,
                        rank: int, world_size: int, seed: int, device: torch.device,
                        on_iter: Callable[[Any], None] | None = None, at_end: str = "stop",
                        buffer_size: int = DEFAULT_BUFFER, agree_every: int = 64,
                        **extra: Any) -> StreamLoader:
    """A :class:`StreamLoader` over ``data``; ``batch_size`` is per process."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: give a positive per-process batch size.")
    if not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size={buffer_size!r}: give a positive shuffle window.")
    bad = [k for k in _REFUSED if extra.get(k)]
    if bad:
        raise TypeError(f"run.loader over a stream does not take {bad}: splitsync deals the "
                        "stream out itself and re-starts workers each epoch with its position.")
    for k in _REFUSED:
        extra.pop(k, None)
    extra.pop("order", None)  # a map-style option; streams have their own order
    readers = StreamReaders(as_source(data), batch_size=batch_size, drop_last=drop_last,
                            shuffle=shuffle, buffer_size=buffer_size, seed=seed, rank=rank,
                            world=world_size, workers=num_workers,
                            collate=collate_fn or default_collate)
    extra.setdefault("pin_memory", device.type == "cuda")
    extra.setdefault("worker_init_fn", worker_init_fn)
    generator = torch.Generator().manual_seed(loader_seed(seed, rank))
    loader = DataLoader(readers, batch_size=None, num_workers=num_workers, generator=generator,
                        **extra)
    return StreamLoader(readers, loader, device, at_end=at_end, on_iter=on_iter,
                        agree_every=agree_every)
