"""What a stream is to splitsync: ``n_shards`` shards, each readable from any offset.

Every kind of stream is adapted to one small interface, :class:`Source`, so the readers
never care where samples come from: shard ``s`` opened at ``start`` yields that shard's
samples from its ``start``-th on. A stream without shards is one shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

__all__ = ["Source", "Shards", "IterSource", "HFSource", "from_webdataset", "read_file"]

_WDS_SPLITTERS = frozenset({"single_node_only", "split_by_node", "split_by_worker"})


class Source(ABC):
    """``n_shards`` shards; ``open(s, start)`` iterates shard ``s`` from its ``start``-th sample."""

    n_shards: int = 1
    kind: str = "stream"
    skips_by_reading: bool = True  # False where the library jumps without decoding

    @abstractmethod
    def open(self, shard: int, start: int) -> Iterator[Any]:
        """Samples of shard ``shard``, from its ``start``-th on."""

    def open_epoch(self, shard: int, start: int, seed: int, epoch: int) -> Iterator[Any]:
        """:meth:`open` in epoch ``epoch`` of a run seeded with ``seed``; a source with
        random stages of its own seeds them from (seed, epoch, shard) here."""
        return self.open(shard, start)


def read_file(path: str | os.PathLike[str]) -> Iterator[Any]:
    """Samples of one shard file: webdataset samples of a tar, JSON objects, or text lines."""
    name = str(path)
    if name.endswith((".tar", ".tgz", ".tar.gz")):
        import webdataset as wds

        yield from wds.DataPipeline(wds.SimpleShardList([name]), wds.tarfile_to_samples())
        return
    with open(name, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            yield json.loads(line) if name.endswith((".jsonl", ".json")) else line


class Shards(Source):
    """Explicit shards: ``Shards(files)`` or ``Shards(items, open=fn)`` (fn(item) -> samples).

    ``open`` must be picklable (a module-level function) when the loader has workers.
    """

    kind = "shards"

    def __init__(self, items: Sequence[Any],
                 open: Callable[[Any], Iterable[Any]] = read_file) -> None:  # noqa: A002
        if not items:
            raise ValueError("Shards(...) needs at least one shard.")
        self.items = list(items)
        self.opener = open
        self.n_shards = len(self.items)

    def open(self, shard: int, start: int) -> Iterator[Any]:
        return islice(iter(self.opener(self.items[shard])), start, None)


class IterSource(Source):
    """Any re-iterable of samples (a torch IterableDataset, a list, ...): one shard."""

    def __init__(self, data: Iterable[Any], kind: str = "iterable") -> None:
        self.data = data
        self.kind = kind

    def open(self, shard: int, start: int) -> Iterator[Any]:
        return islice(iter(self.data), start, None)


class HFSource(Source):
    """A stream with ``n_shards`` and ``shard(num_shards, index)``: a Hugging Face
    ``datasets.IterableDataset``, or a torch IterableDataset with the same two members.

    Offsets inside a shard use the shard's own ``state_dict``/``load_state_dict`` where it
    has them (HF: Arrow-backed shards jump over record batches without decoding them),
    else its ``skip``, else reading and dropping.
    """

    def __init__(self, ds: Any, kind: str = "Hugging Face IterableDataset") -> None:
        self.ds = ds
        self.kind = kind
        self.hf = type(ds).__module__.split(".")[0] == "datasets"
        self.n_shards = int(ds.n_shards)
        if self.n_shards < 1:
            raise ValueError(f"{kind} reports n_shards={self.n_shards}; need at least 1.")
        self.skips_by_reading = not callable(getattr(ds, "state_dict", None))

    def open(self, shard: int, start: int) -> Iterator[Any]:
        part = self.ds.shard(num_shards=self.n_shards, index=shard)
        if start and not _hf_seek(part, start):
            if callable(getattr(part, "skip", None)):
                part = part.skip(start)  # the library's own skip: reads and drops
            else:
                return islice(iter(part), start, None)
        return _hf_rows(part) if self.hf else iter(part)


def _hf_rows(part: Any, chunk: int = 256) -> Iterator[dict[str, Any]]:
    """Rows of an HF stream through its public ``iter(batch_size)``: unlike ``iter(ds)`` it
    does not split itself among DataLoader workers (splitsync already gave this worker its
    shard), and it converts columns a chunk at a time."""
    for cols in part.iter(batch_size=chunk):
        keys = list(cols)
        if not keys:
            continue
        for i in range(len(cols[keys[0]])):
            yield {k: cols[k][i] for k in keys}


def _hf_seek(part: Any, start: int) -> bool:
    """Position a one-shard HF stream at ``start`` through its own ``load_state_dict``.

    Arrow-backed shards then jump over whole record batches without decoding them. Only a
    state with exactly one example counter is rewritten; anything else uses ``skip``.
    """
    if not callable(getattr(part, "state_dict", None)):
        return False
    try:
        state = part.state_dict()
    except (NotImplementedError, TypeError):
        return False
    found: list[dict[str, Any]] = []

    def walk(d: dict[str, Any]) -> None:
        for k, v in d.items():
            if k == "shard_example_idx":
                found.append(d)
            elif isinstance(v, dict):
                walk(v)

    walk(state)
    if len(found) != 1 or found[0].get("shard_idx", 0) != 0:
        return False
    found[0]["shard_example_idx"] = start
    part.load_state_dict(state)
    return True


class _WdsShards(Shards):
    """A webdataset pipeline rebuilt per shard: its url list, then its own stages.

    Its random stages (``.shuffle(n)``, ``detshuffle``) seed themselves from the pid and the
    time, or count epochs in the stage object, so a re-opened shard would come in another
    order and a resume mid-shard would skip other samples than were trained. Each opening
    gets them reseeded from (seed, epoch, shard): the same order in every process.
    """

    kind = "webdataset pipeline"

    def __init__(self, urls: Sequence[str], stages: Sequence[Any]) -> None:
        super().__init__(urls, open=read_file)
        self.stages = list(stages)

    def open(self, shard: int, start: int) -> Iterator[Any]:
        return self.open_epoch(shard, start, 0, 0)

    def open_epoch(self, shard: int, start: int, seed: int, epoch: int) -> Iterator[Any]:
        import webdataset as wds

        stages = [_reseeded(st, _stage_seed(seed, epoch, shard, i))
                  for i, st in enumerate(self.stages)]
        pipe = wds.DataPipeline(wds.SimpleShardList([self.items[shard]]), *stages)
        return islice(iter(pipe), start, None)


def _stage_seed(*parts: int) -> int:
    key = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def _shuffle_args(stage: Any) -> tuple[int, int] | None:
    """(bufsize, initial) of a webdataset shuffle stage, or None for any other stage."""
    from webdataset import filters

    if isinstance(stage, filters.detshuffle):
        return int(stage.bufsize), int(stage.initial)
    if isinstance(stage, filters.FilterFunction) and stage.f is filters._shuffle:
        args = dict(zip(("bufsize", "initial"), stage.args, strict=False))
        bufsize = args.get("bufsize", stage.kw.get("bufsize", 1000))
        initial = args.get("initial", stage.kw.get("initial", 100))
        return int(bufsize), int(initial)
    return None


def _reseeded(stage: Any, seed: int) -> Any:
    """``stage`` itself, or a shuffle stage with the same buffer drawing from ``seed``."""
    found = _shuffle_args(stage)
    if found is None:
        return stage
    from webdataset import filters

    return filters.FilterFunction(filters._shuffle, found[0], found[1], seed=seed)


def _stage_name(stage: Any) -> str:
    found = _shuffle_args(stage)
    return f"shuffle({found[0]})" if found else type(stage).__name__


def from_webdataset(data: Any) -> Source:
    """The source for a webdataset pipeline: its shard urls reopened one by one when it
    starts from a list of them, else the pipeline read whole (refused with a random stage)."""
    stages = list(getattr(data, "pipeline", []))
    urls = getattr(stages[0], "urls", None) if stages else None
    if not isinstance(urls, list):
        random = [_stage_name(st) for st in stages if _shuffle_args(st) is not None]
        if random:
            raise TypeError(
                f"run.loader got a webdataset pipeline with a random stage ({random[0]}) and "
                "no list of shard urls, so splitsync cannot reseed it per shard: its order "
                "would differ after a resume and samples would be lost and repeated. Build "
                "it from a list of urls (wds.WebDataset([...]) or wds.SimpleShardList(urls)), "
                "whose shuffle stages splitsync seeds from (seed, epoch, shard), or drop the "
                "stage and pass run.loader(..., shuffle=True, buffer_size=n).")
        return IterSource(data, "webdataset pipeline")
    rest = [s for s in stages[1:] if getattr(s, "__name__", "") not in _WDS_SPLITTERS]
    return _WdsShards(urls, rest)
