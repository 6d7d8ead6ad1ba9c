"""Real gloo groups: sharding, epochs, seeds, collectives and teardown."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import splitsync
from splitsync.testing import spawn

N = 23  # not a multiple of 2 or 3: exercises padding


def _shards(rank: int, world: int, seed: int | None) -> dict[str, object]:
    with splitsync.init(seed=seed) as run:
        model = run.model(nn.Linear(4, 3))
        first = [p.detach().clone() for p in run.unwrap(model).parameters()]
        data = TensorDataset(torch.arange(N))
        loader = run.loader(data, batch_size=4, shuffle=True)
        epochs = []
        for _ in run.epochs(2):
            epochs.append([int(i) for (b,) in loader for i in b])
        stats = {
            "mean": run.mean(float(rank)),
            "sum": run.sum(torch.tensor([rank, 1])).tolist(),
            "max": run.max(rank),
            "gather": run.gather(torch.full((rank + 1,), rank)).tolist(),
            "bcast": run.broadcast(f"from {rank}"),
        }
        run.barrier()
        return {"epochs": epochs, "params": first, "padding": loader.sampler.padding,
                "seed": run.seed, "stats": stats, "type": type(model).__name__}


@pytest.mark.parametrize("world", [2, 3])
def test_disjoint_shards_cover_dataset_and_reshuffle(world: int) -> None:
    out = spawn(_shards, world, 5)
    for epoch in range(2):
        shards = [o["epochs"][epoch] for o in out]
        real = [s[: len(s) - o["padding"]] for s, o in zip(shards, out, strict=True)]
        flat = [i for s in real for i in s]
        assert sorted(flat) == list(range(N))  # disjoint and covering
        assert all(len(s) == len(shards[0]) for s in shards)  # equal length, padded
    assert out[0]["epochs"][0] != out[0]["epochs"][1]  # set_epoch changed the order
    assert all(o["type"] == "DistributedDataParallel" for o in out)
    stats = out[0]["stats"]
    assert stats["mean"] == pytest.approx(sum(range(world)) / world)
    assert stats["sum"] == [sum(range(world)), world] and stats["max"] == world - 1
    assert stats["gather"] == [r for r in range(world) for _ in range(r + 1)]
    assert all(o["stats"]["bcast"] == "from 0" for o in out)


@pytest.mark.parametrize("seed", [None, 11])
def test_initial_parameters_agree_with_and_without_seed(seed: int | None) -> None:
    out = spawn(_shards, 2, seed)
    assert out[0]["seed"] == out[1]["seed"]
    if seed is not None:
        assert out[0]["seed"] == seed
    for a, b in zip(out[0]["params"], out[1]["params"], strict=True):
        assert torch.equal(a, b)


def _fails(rank: int, world: int) -> bool:
    try:
        with splitsync.init(seed=0):
            # both ranks inside first: rank 0 hosts the store, and leaving at once could close
            # it under a rank still joining (a connection reset on a loaded machine)
            dist.barrier()
            raise KeyError("boom")
    except KeyError:
        return dist.is_initialized()


def test_group_is_destroyed_on_exception() -> None:
    assert spawn(_fails, 2) == [False, False]
