"""The map-style sampler's O(1) order: a seeded bijection, the same dealing as randperm's."""

from __future__ import annotations

import random
import tracemalloc

import pytest
import torch
from torch.utils.data import TensorDataset

import splitsync as ss
from splitsync.data.loader import ShardSampler
from splitsync.data.permute import EpochOrders, Permutation, whole_orders

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


def _reference(n: int, seed: int, epoch: int, positions: list[int]) -> list[int]:
    """The definition, one value at a time in plain Python: one round trip, then walk."""
    p = Permutation(n, seed, epoch)
    return [p._walk_one(i) for i in positions]


# sizes around the domain's powers of four, the whole-order limit (65536) and odd ones
_SIZES = [1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 255, 257, 1000, 2048, 4095, 4097, 65535,
          65536]


@pytest.mark.parametrize("n", _SIZES)
def test_whole_orders_of_several_epochs_are_the_per_index_permutation(n: int) -> None:
    rng = random.Random(n)
    seed, first = rng.randrange(1 << 64), rng.randrange(1000)
    rows = whole_orders(n, seed, first, 3)
    assert rows.shape == (3, n) and rows.dtype == torch.int64
    picks = sorted({0, n - 1, *(rng.randrange(n) for _ in range(200))})
    for k in range(3):
        assert sorted(rows[k].tolist()) == list(range(n))  # a bijection of [0, n)
        assert rows[k][picks].tolist() == _reference(n, seed, first + k, picks)
        assert torch.equal(Permutation(n, seed, first + k).at(torch.tensor(picks)), rows[k][picks])


def test_epoch_orders_answer_any_epoch_in_any_order() -> None:
    n, seed = 1000, 7
    orders = EpochOrders(n, seed)
    assert orders.count > 1  # a small dataset: several epochs per call
    for epoch in [0, 1, orders.count - 1, orders.count, 3, 40, 39, 0]:  # across blocks, back
        want = whole_orders(n, seed, epoch, 1)[0]
        assert torch.equal(orders.order(epoch), want), epoch
    assert not torch.equal(orders.order(1), orders.order(2))
    assert whole_orders(0, seed, 0, 2).shape == (2, 0)
    with pytest.raises(ValueError, match="whole orders"):
        whole_orders(70_000, seed, 0, 1)


@pytest.mark.parametrize("n", [65537, 100_003, 10**9, 2**33 + 7])
def test_large_permutations_per_chunk_are_the_definition(n: int) -> None:
    """Above the whole-order limit: round tables (n < 2^32) or rounds computed (above)."""
    rng = random.Random(n)
    picks = [0, n - 1, *(rng.randrange(n) for _ in range(300))]
    got = Permutation(n, 11, 2).at(torch.tensor(picks, dtype=torch.int64)).tolist()
    assert got == _reference(n, 11, 2, picks)


@pytest.mark.parametrize("order", ["bijection", "randperm"])
def test_a_sampler_over_many_epochs_deals_what_a_fresh_one_does(order: str) -> None:
    """Its orders kept epochs ahead change nothing: per epoch, after resumes, per rank."""
    data = TensorDataset(torch.arange(77.0))
    kept = [ShardSampler(data, 3, r, True, 5, order=order) for r in range(3)]
    for epoch, start in [(0, 0), (1, 0), (2, 10), (17, 0), (16, 40), (5, 76), (6, 0)]:
        for r, s in enumerate(kept):
            fresh = ShardSampler(data, 3, r, True, 5, order=order)
            if start:
                s.resume_at(epoch, start)
                fresh.resume_at(epoch, start)
            else:
                s.set_epoch(epoch)
                fresh.set_epoch(epoch)
            got = list(s)
            assert got == list(fresh) == s.pass_order().indices(0, len(s)).tolist()
            whole = fresh.global_order()
            assert got[: len(s) - s.padding] == whole[start + r :: 3][: len(s) - s.padding]
