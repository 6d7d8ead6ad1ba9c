"""Streams over real 2- and 3-rank groups: every sample read once across ranks and workers."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from streamkit import make, shard_ids
from torch import nn

import splitsync as ss
from splitsync.testing import spawn

pytest.importorskip("datasets")
pytest.importorskip("webdataset")
pytestmark = pytest.mark.slow
ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
BATCH = 3


def sizes(n_shards: int) -> list[int]:
    if n_shards == 1:
        return [25]
    return [4 + (i % 3) for i in range(n_shards)]  # shards of different lengths


def cases(world: int) -> list[tuple[str, int, int, str]]:
    """(kind, workers, n_shards, expected mode) for every stream kind and both modes."""
    out = []
    for workers in (0, 2):
        readers = world * max(1, workers)
        for kind in ("torch", "hf", "wds"):
            out.append((kind, workers, readers, "shard"))
            out.append((kind, workers, readers + 1, "element"))
        out.append(("plain", workers, 1, "element"))
    return out


def read_all(rank: int, world: int, root: str) -> dict[str, tuple[str, list[int]]]:
    got = {}
    with ss.init(seed=5) as run:
        for kind, workers, n, _ in cases(world):
            name = f"{kind}-w{workers}-s{n}"
            data, collate = make(kind, f"{root}/{name}/r{rank}", sizes(n))
            loader = run.loader(data, batch_size=BATCH, num_workers=workers, shuffle=True,
                                buffer_size=4, collate_fn=collate, at_end="uneven")
            ids = [int(i) for x in loader for i in x[:, 0].tolist()]
            got[name] = (loader.readers.layout.mode, ids)
    return got


@pytest.mark.timeout(600)
# 3 ranks start 6 loader workers a case: in the extended trials
@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.extended)])
def test_every_sample_read_exactly_once(tmp_path: Path, world: int) -> None:
    out = spawn(read_all, world, str(tmp_path), timeout=500, env=ENV)
    for kind, workers, n, mode in cases(world):
        name = f"{kind}-w{workers}-s{n}"
        assert all(r[name][0] == mode for r in out), name
        counts = Counter(i for r in out for i in r[name][1])
        total = sum(sizes(n))
        assert sorted(counts) == list(range(total)), f"{name}: samples missed"
        assert max(counts.values()) == 1, f"{name}: samples read twice"
        assert all(r[name][1] for r in out), f"{name}: a rank read nothing"


def uneven(rank: int, world: int, at_end: str) -> tuple[int, list[int], int]:
    """Rank 0's shard holds 2 batches, rank 1's 10: a DDP model must not hang."""
    with ss.init(seed=0) as run:
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data, collate = make("torch", "", [2 * BATCH, 10 * BATCH])
        loader = run.loader(data, batch_size=BATCH, collate_fn=collate, at_end=at_end)
        steps, ids = 0, []
        with run.join(model, enable=at_end == "uneven"):
            for x in loader:
                run.backward(model(x).sum())
                run.step(opt)
                steps += 1
                ids += [int(i) for i in x[:, 0].tolist()]
        assert loader.ended_early == ((0, loader.untrained) if at_end == "stop" else None)
        return steps, ids, loader.untrained


@pytest.mark.timeout(180)
def test_uneven_parts_stop_together_without_duplicates() -> None:
    out = spawn(uneven, 2, "stop", timeout=150)
    assert [steps for steps, _, _ in out] == [2, 2]  # everyone stops at the first end
    ids = [i for _, got, _ in out for i in got]
    assert len(ids) == len(set(ids)) == 4 * BATCH  # nothing duplicated
    # rank 1's held batches, reported: the rest of the window and the batch read ahead
    # (which tells a rank that the batch it yields is the epoch's last)
    assert all(untrained == 2 * BATCH for _, _, untrained in out)


@pytest.mark.timeout(180)
def test_uneven_parts_with_join_train_everything() -> None:
    out = spawn(uneven, 2, "uneven", timeout=150)
    assert [steps for steps, _, _ in out] == [2, 10]
    assert sorted(i for _, got, _ in out for i in got) == [i for s in shard_ids([6, 30])
                                                            for i in s]


def element_tail(rank: int, world: int) -> tuple[list[int], int]:
    with ss.init(seed=0) as run:
        data, collate = make("plain", "", [27])
        loader = run.loader(data, batch_size=4, collate_fn=collate)  # 7 global batches
        return [int(i) for x in loader for i in x[:, 0].tolist()], loader.untrained


@pytest.mark.timeout(180)
def test_element_level_end_drops_only_the_reported_last_round() -> None:
    out = spawn(element_tail, 2, timeout=150)
    ids = sorted(i for got, _ in out for i in got)
    assert ids == list(range(24))  # 3 full rounds of 2 batches; batch 6 (ids 24-26) held
    assert [u for _, u in out] == [3, 3]
