"""Streams with known sample ids for the stream tests: every sample's id is its value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset


def shard_ids(sizes: list[int]) -> list[list[int]]:
    """Consecutive ids, ``sizes[i]`` of them in shard i."""
    out, nxt = [], 0
    for n in sizes:
        out.append(list(range(nxt, nxt + n)))
        nxt += n
    return out


class Ranges(IterableDataset):
    """A torch IterableDataset with shards (``n_shards`` + ``shard(num_shards, index)``)."""

    def __init__(self, sizes: list[int]) -> None:
        self.parts = shard_ids(sizes)
        self.n_shards = len(sizes)

    def shard(self, num_shards: int, index: int) -> list[torch.Tensor]:
        assert num_shards == self.n_shards
        return [torch.tensor([float(i), 1.0]) for i in self.parts[index]]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (torch.tensor([float(i), 1.0]) for part in self.parts for i in part)


class Plain(IterableDataset):
    """A torch IterableDataset without shards: one stream of ``n`` samples."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (torch.tensor([float(i), 1.0]) for i in range(self.n))


def write_text(root: Path, sizes: list[int]) -> list[str]:
    """One text file per shard, one id per line (an HF streaming "text" dataset)."""
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for s, ids in enumerate(shard_ids(sizes)):
        f = root / f"part-{s:03d}.txt"
        f.write_text("".join(f"{i}\n" for i in ids))
        files.append(str(f))
    return files


def write_tars(root: Path, sizes: list[int]) -> list[str]:
    """One webdataset tar per shard; each sample has an ``id`` entry."""
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    files = []
    for s, ids in enumerate(shard_ids(sizes)):
        f = root / f"shard-{s:03d}.tar"
        with wds.TarWriter(str(f)) as w:
            for i in ids:
                w.write({"__key__": f"{i:06d}", "id": str(i)})
        files.append(str(f))
    return files


def hf_stream(files: list[str]) -> Any:
    import datasets

    return datasets.load_dataset("text", data_files=files, split="train", streaming=True)


def ids_of_tensors(batch: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(batch)


def ids_of_text(batch: list[dict[str, str]]) -> torch.Tensor:
    return torch.tensor([[float(x["text"]), 1.0] for x in batch])


def ids_of_tar(batch: list[dict[str, Any]]) -> torch.Tensor:
    return torch.tensor([[float(x["id"].decode()), 1.0] for x in batch])


def make(kind: str, root: str, sizes: list[int]) -> tuple[Any, Any]:
    """(stream, collate_fn) of ``kind`` for shard sizes ``sizes`` (files under ``root``)."""
    if kind == "torch":
        return Ranges(sizes), ids_of_tensors
    if kind == "plain":
        return Plain(sum(sizes)), ids_of_tensors
    if kind == "hf":
        return hf_stream(write_text(Path(root) / "hf", sizes)), ids_of_text
    if kind == "wds":
        return write_tars(Path(root) / "wds", sizes), ids_of_tar
    raise ValueError(kind)
