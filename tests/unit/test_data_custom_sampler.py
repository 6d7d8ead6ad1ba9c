"""Samplers of the user's own, dealt out over ranks (splitsync.data.custom): every index of
the drawn order read once per epoch across any number of ranks, resumed mid-epoch at any
world size on exactly the rest, the same order on every rank and restart for samplers that
draw from torch's global generator, and a clear refusal of those that would not agree."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import RandomSampler, WeightedRandomSampler

from splitsync.data.custom import SamplerShards


def _shards(sampler: object, n: int, world: int, epoch: int = 0) -> list[SamplerShards]:
    out = [SamplerShards(sampler, n, num_replicas=world, rank=r, seed=3) for r in range(world)]
    for s in out:
        s.set_epoch(epoch)
    return out


def _weighted(n: int, k: int) -> WeightedRandomSampler:
    return WeightedRandomSampler(torch.arange(1.0, n + 1), num_samples=k, replacement=True)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), k=st.integers(1, 45), world=st.integers(1, 4),
       other=st.integers(1, 4), cut=st.integers(0, 45), epoch=st.integers(0, 3))
def test_ranks_read_the_drawn_order_once_and_resume_on_the_rest(
        n: int, k: int, world: int, other: int, cut: int, epoch: int) -> None:
    order = _shards(_weighted(n, k), n, 1, epoch)[0].drawn().tolist()
    assert len(order) == k and all(0 <= i < n for i in order)
    ranks = _shards(_weighted(n, k), n, world, epoch)
    real = [list(s)[: s.num_samples - s.padding] for s in ranks]
    assert sorted(i for part in real for i in part) == sorted(order)  # a new sampler object:
    # the same order, drawn from (seed, epoch), as every rank and every restart draws it
    consumed = min(cut, k)
    resumed = _shards(_weighted(n, k), n, other, epoch)
    for s in resumed:
        s.resume_at(epoch, consumed)
        s.set_epoch(epoch)
    rest = [list(s)[: s.num_samples - s.padding] for s in resumed]
    assert sorted(i for part in rest for i in part) == sorted(order[consumed:])


def test_every_rank_of_a_random_sampler_agrees_and_epochs_differ() -> None:
    data = list(range(12))
    first = [s.drawn().tolist() for s in _shards(RandomSampler(data), 12, 3)]
    assert first[0] == first[1] == first[2] and sorted(first[0]) == data
    assert _shards(RandomSampler(data), 12, 1, epoch=1)[0].drawn().tolist() != first[0]
    before = torch.get_rng_state()
    _shards(RandomSampler(data), 12, 1)[0].drawn()
    assert torch.equal(torch.get_rng_state(), before)  # the draw leaves the user's RNG alone


def test_samplers_that_would_not_agree_are_refused() -> None:
    g = torch.Generator().manual_seed(0)  # a generator of its own, never reseeded
    (shard,) = _shards(RandomSampler(list(range(8)), generator=g), 8, 1)
    with pytest.raises(ValueError, match="drawn twice for epoch 0, its order differed"):
        list(shard)

    class Short(torch.utils.data.Sampler[int]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([0, 1])

        def __len__(self) -> int:
            return 3

    with pytest.raises(ValueError, match="yielded 2 indices where its length says 3"):
        list(_shards(Short(), 4, 1)[0])
    with pytest.raises(ValueError, match="outside the dataset's 0..0"):
        list(_shards(_weighted(3, 3), 1, 1)[0])
    with pytest.raises(TypeError, match="needs a length"):
        SamplerShards(iter([1]), 4, num_replicas=1, rank=0, seed=0)
