"""The one builder behind ``run.loader(x)``: it decides what ``x`` gets, and builds it.

A stream (see :func:`is_stream`) gets a
:class:`~splitsync.data.stream.StreamLoader`, anything indexable a
:class:`~splitsync.data.loader.DeviceLoader`; a ``DataLoader`` passed in gives its own
options to either. Both follow one protocol, :class:`ResumableLoader`, which is all the
checkpoint code knows of loaders. Loaders call the run back only through their
:class:`~splitsync.data.loader.LoaderHooks`, which call observers directly: the walk from ``run.loader`` to the
first batch goes down the layers and never back into the run.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from splitsync.data.custom import SamplerShards
from splitsync.data.loader import (
    DeviceLoader,
    LoaderHooks,
    ShardSampler,
    direct,
    loader_kwargs_from,
)
from splitsync.data.stream.loader import StreamLoader
from splitsync.data.stream.readers import StreamReaders
from splitsync.data.stream.sources import HFSource, IterSource, Shards, Source, from_webdataset
from splitsync.distributed.logs import get_logger
from splitsync.distributed.seeding import loader_seed, worker_init_fn
from splitsync.preemption.workers import shielded

__all__ = ["LoaderHooks", "ResumableLoader", "make_loader", "warn_if_empty", "check_marks", "is_stream", "as_source", "direct",
           "DEFAULT_BUFFER"]

DEFAULT_BUFFER = 1024
SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".jsonl", ".txt", ".json")
_STREAM_REFUSED = ("sampler", "batch_sampler", "persistent_workers")


@runtime_checkable
class ResumableLoader(Protocol):
    """What ``run.loader`` returns, map-style or stream: batches on the device, epochs, and
    a position to save and restore (the checkpoint code knows nothing else of loaders)."""

    batches_seen: int
    last_batch: bool

    @property
    def length(self) -> int | None:
        """Batches per pass on this rank where known (map-style), else None (streams)."""

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; a pending restored position applies to its own epoch only."""

    def position(self) -> dict[str, Any]:
        """Where to continue (plain numbers; collective for streams)."""

    def rng_state(self) -> torch.Tensor | None:
        """This rank's generator state that goes with :meth:`position`."""

    def restore(self, pos: Mapping[str, Any], rng_state: torch.Tensor | None = None) -> None:
        """Continue at ``pos`` (from :meth:`position`, at any world size)."""

    def trim_padding(self, x: torch.Tensor) -> torch.Tensor:
        """The current batch's results without padded duplicates."""


def make_loader(data: Dataset | DataLoader | Any, batch_size: int | None, *, shuffle: bool,
                drop_last: bool, num_workers: int, collate_fn: Any, rank: int, world_size: int,
                seed: int, device: torch.device, hooks: LoaderHooks,
                shield: Sequence[signal.Signals | str] = (),
                **extra: Any) -> DeviceLoader | StreamLoader:
    """What ``run.loader(data, batch_size, ...)`` returns; ``batch_size`` is per process.
    Its workers ignore ``shield`` (the signals the run stops on) sent to their process
    group: see :mod:`splitsync.preemption.workers`."""
    inner = data.dataset if isinstance(data, DataLoader) else data
    if is_stream(inner):
        if isinstance(data, DataLoader):  # keep the DataLoader's own batching options
            batch_size = batch_size or data.batch_size
            num_workers, drop_last = data.num_workers, data.drop_last
            collate_fn = collate_fn or data.collate_fn
        return _stream_loader(inner, batch_size, shuffle=shuffle, drop_last=drop_last,
                              num_workers=num_workers, collate_fn=collate_fn, rank=rank,
                              world_size=world_size, seed=seed, device=device, hooks=hooks,
                              shield=shield, **extra)
    return _map_loader(data, batch_size, shuffle=shuffle, drop_last=drop_last,
                       num_workers=num_workers, collate_fn=collate_fn, rank=rank,
                       world_size=world_size, seed=seed, device=device, hooks=hooks,
                       shield=shield, **extra)


def _map_loader(data: Dataset | DataLoader, batch_size: int | None, *, rank: int,
                world_size: int, seed: int, device: torch.device, hooks: LoaderHooks,
                shield: Sequence[signal.Signals | str] = (), **options: Any) -> DeviceLoader:
    """A DataLoader over this rank's shard; ``batch_size`` is per process, never rescaled.

    ``order`` (an option) is the shuffle order (see :class:`ShardSampler`): "bijection" by
    default, flat in the dataset's size; "randperm" for DistributedSampler's exact order.
    ``sampler`` (an option): a sampler of the user's own gives the global order instead
    (see :mod:`splitsync.data.custom`).
    """
    # Distinct, reproducible worker seeds per rank: the generator seeds the workers' base.
    generator = torch.Generator()
    generator.manual_seed(loader_seed(seed, rank))
    if isinstance(data, DataLoader):
        kwargs = loader_kwargs_from(data)
        if kwargs.get("worker_init_fn") is None:
            kwargs.pop("worker_init_fn", None)
        for k in ("shuffle", "drop_last", "num_workers", "collate_fn"):
            options.pop(k)  # run.loader's defaults: the DataLoader's own options win
        kwargs.update(options)
    else:
        if batch_size is None:
            raise TypeError("run.loader(dataset, batch_size=...) needs a per-process batch_size.")
        kwargs = dict(dataset=data, batch_size=batch_size, **options)
    for obs in hooks.adjust:  # e.g. splitsync verify's equal global batch
        kwargs = obs.loader_kwargs(kwargs)
    dataset, batch_size = kwargs.pop("dataset"), kwargs.pop("batch_size")
    shuffle, drop_last = kwargs.pop("shuffle"), kwargs.pop("drop_last")
    order = kwargs.pop("order", "bijection")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: give a positive per-process batch size.")
    kwargs.setdefault("pin_memory", device.type == "cuda")
    kwargs["worker_init_fn"] = shielded(kwargs.get("worker_init_fn", worker_init_fn), shield)
    sampler = _sampler(dataset, kwargs, shuffle=shuffle, rank=rank, world_size=world_size,
                       seed=seed, drop_last=drop_last, order=order)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                        generator=generator, **kwargs)
    return DeviceLoader(loader, device, world_size, hooks)


def _sampler(dataset: Any, kwargs: dict[str, Any], *, shuffle: bool, rank: int,
             world_size: int, seed: int, drop_last: bool, order: str) -> ShardSampler:
    """splitsync's sharded sampler, over the order of the user's ``sampler=`` if given."""
    if kwargs.pop("batch_sampler", None) is not None:
        raise TypeError("run.loader(..., batch_sampler=...): a batch sampler's batches cannot "
                        "be dealt out over ranks and resumed; give sampler= (one index at a "
                        "time) with batch_size=, and splitsync batches each rank's part.")
    user = kwargs.pop("sampler", None)
    if user is None:
        return ShardSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                            seed=seed, drop_last=drop_last, order=order)
    if shuffle:
        raise ValueError("run.loader(..., sampler=..., shuffle=True): the sampler gives the "
                         "order; drop shuffle=True (as DataLoader refuses both).")
    return SamplerShards(user, len(dataset), num_replicas=world_size, rank=rank, seed=seed,
                         drop_last=drop_last)


def _stream_loader(data: Any, batch_size: int | None, *, shuffle: bool, drop_last: bool,
                   num_workers: int, collate_fn: Callable[[list[Any]], Any] | None,
                   rank: int, world_size: int, seed: int, device: torch.device,
                   hooks: LoaderHooks, at_end: str = "stop",
                   buffer_size: int = DEFAULT_BUFFER, agree_every: int = 64,
                   shield: Sequence[signal.Signals | str] = (), **extra: Any) -> StreamLoader:
    """A :class:`StreamLoader` over ``data``; ``batch_size`` is per process."""
    if batch_size is None:
        raise TypeError("run.loader(stream, batch_size=...) needs a per-process batch_size.")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: give a positive per-process batch size.")
    if not isinstance(buffer_size, int) or buffer_size < 1:
        raise ValueError(f"buffer_size={buffer_size!r}: give a positive shuffle window.")
    bad = [k for k in _STREAM_REFUSED if extra.get(k)]
    if bad:
        raise TypeError(f"run.loader over a stream does not take {bad}: splitsync deals the "
                        "stream out itself and re-starts workers each epoch with its position.")
    for k in _STREAM_REFUSED:
        extra.pop(k, None)
    extra.pop("order", None)  # a map-style option; streams have their own order
    source = as_source(data)
    generator = torch.Generator()
    generator.manual_seed(loader_seed(seed, rank))
    readers = StreamReaders(source, batch_size=batch_size, drop_last=drop_last,
                            shuffle=shuffle, buffer_size=buffer_size, seed=seed, rank=rank,
                            world=world_size, workers=num_workers,
                            collate=collate_fn or default_collate)
    extra.setdefault("pin_memory", device.type == "cuda")
    extra["worker_init_fn"] = shielded(extra.get("worker_init_fn", worker_init_fn), shield)
    loader = DataLoader(readers, batch_size=None, num_workers=num_workers, generator=generator,
                        **extra)
    return StreamLoader(readers, loader, device, at_end=at_end, hooks=hooks,
                        agree_every=agree_every)


# --- what is a stream ---------------------------------------------------------------------
def _is_file_list(data: Any) -> bool:
    if not isinstance(data, (list, tuple)) or not data:
        return False
    if all(isinstance(x, os.PathLike) for x in data):
        return True
    return all(isinstance(x, str) and x.endswith(SHARD_SUFFIXES) and Path(x).is_file()
               for x in data)


def _shardable(data: Any) -> bool:
    return isinstance(getattr(data, "n_shards", None), int) and callable(
        getattr(data, "shard", None))


def is_stream(data: Any) -> bool:
    """True for data that ``run.loader`` reads as a stream rather than by index."""
    if isinstance(data, (Source, IterableDataset)) or _is_file_list(data):
        return True
    if _shardable(data):
        return True
    indexable = hasattr(data, "__len__") and hasattr(data, "__getitem__")
    return hasattr(data, "__iter__") and not indexable


def as_source(data: Any) -> Source:
    """The :class:`Source` for ``data`` (see :func:`is_stream`), or a clear error."""
    if isinstance(data, Source):
        return data
    root = type(data).__module__.split(".")[0]
    if _shardable(data):
        kind = "Hugging Face IterableDataset" if root == "datasets" else type(data).__name__
        return HFSource(data, kind)
    if root == "webdataset":
        return from_webdataset(data)
    if _is_file_list(data):
        return Shards(list(data))
    if iter(data) is data:  # a generator or iterator: one pass only, for one reader
        raise TypeError(
            f"run.loader got a one-shot {type(data).__name__}: every rank and worker (and "
            "every epoch) needs its own pass. Pass something re-iterable instead: a "
            "torch IterableDataset, a list, or splitsync.Shards(items, open=fn).")
    kind = "torch IterableDataset" if isinstance(data, IterableDataset) else "iterable"
    return IterSource(data, kind)


def warn_if_empty(loader: Any, rank: int, world_size: int) -> None:
    """A map-style loader with no batch on this rank trains nothing there: say so, with
    the numbers and the fix (a stream's length is not known beforehand)."""
    if getattr(loader, "sampler", None) is None or loader.train is False:
        return
    n, size = len(loader.dataset), loader.batch_size or 1
    if len(loader) == 0:
        get_logger().warning(
            "run.loader: rank %d gets no batch: %d sample(s) over %d rank(s) at batch_size=%d"
            "%s leave it none, so it trains nothing (and the audit reports it). Use a "
            "smaller batch_size, fewer processes or drop_last=False.", rank, n, world_size,
            size, " with drop_last=True" if loader.loader.drop_last else "")


def check_marks(train: Any, repeats: Any) -> None:
    """``run.loader``'s ``train=`` and ``repeats=``, or a clear error."""
    if train not in (None, True, False):
        raise TypeError(f"run.loader(..., train={train!r}): True (training), False "
                        "(evaluation) or None (not said).")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"run.loader(..., repeats={repeats!r}): how many times the "
                         "sampler delivers each sample per epoch, an integer >= 1.")
