"""The map-style sampler's O(1) order: a seeded bijection, the same dealing as randperm's."""

from __future__ import annotations

import tracemalloc

import pytest
import torch
from torch.utils.data import TensorDataset

import splitsync as ss
from splitsync.data.loader import ShardSampler
from splitsync.data.permute import Permutation

DATA = TensorDataset(torch.arange(10.0))


class Huge:
    """A dataset of 10^9 indices that never materialises anything."""

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 1000, 4099])
def test_permutation_is_a_bijection_and_per_index(n: int) -> None:
    p = Permutation(n, seed=3, epoch=1)
    order = list(p.iter_positions(0, n, 1))
    assert sorted(order) == list(range(n))
    assert order == [p[i] for i in range(n)]
    assert list(Permutation(n, 3, 1).iter_positions(0, n, 1)) == order  # reproducible
    if n > 10:
        assert list(Permutation(n, 3, 2).iter_positions(0, n, 1)) != order  # reshuffled
        assert order != list(range(n))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("start", [0, 3, 4, 9])
def test_bijection_deals_positions_like_randperm(world: int, drop_last: bool,
                                                 start: int) -> None:
    """Same positions per rank, padding and resume as the randperm (DistributedSampler) order."""
    def dealt(order: str) -> list[list[int]]:
        samplers = [ShardSampler(DATA, world, r, True, 7, drop_last, order=order)
                    for r in range(world)]
        glob = samplers[0].global_order()
        for s in samplers:
            s.resume_at(0, start)
        return [[glob.index(i) for i in s] for s in samplers]

    assert dealt("bijection") == dealt("randperm")


def test_resume_at_another_world_size_reads_the_rest_once() -> None:
    n, consumed = 29, 8
    two = ShardSampler(range(n), 2, 0, True, 1, order="bijection")
    order = two.global_order()
    three = [ShardSampler(range(n), 3, r, True, 1, order="bijection") for r in range(3)]
    for s in three:
        s.resume_at(0, consumed)
    rest = [i for s in three for i in list(s)[: len(s) - s.padding]]
    assert sorted(rest) == sorted(order[consumed:])


def test_epoch_start_memory_does_not_grow_with_the_dataset() -> None:
    s = ShardSampler(Huge(), 4, 1, True, 0, order="bijection")  # type: ignore[arg-type]
    tracemalloc.start()
    s.set_epoch(3)
    it = iter(s)
    first = [next(it) for _ in range(5)]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 5_000_000  # a randperm order of 10^9 would be 8 GB
    assert len(set(first)) == 5 and all(0 <= i < 10**9 for i in first)


def test_run_loader_uses_the_bijection_and_keeps_randperm_available() -> None:
    with ss.init(seed=0) as run:
        assert run.loader(DATA, batch_size=2, shuffle=True).sampler.order == "bijection"
        assert run.loader(DATA, batch_size=2, shuffle=True,
                          order="randperm").sampler.order == "randperm"
    with pytest.raises(ValueError, match="order='nope'"):
        ShardSampler(DATA, 1, 0, True, 0, order="nope")
