"""A pass's order: the indices a sampler hands a rank, answered by position, also later."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler, TensorDataset

from splitsync.data.loader import ShardSampler
from splitsync.data.order import ORDERS


def reference(order: list[int], start: int, world: int, rank: int, drop_last: bool) -> list[int]:
    """DistributedSampler's dealing of the epoch's positions from ``start`` on: the padding
    repeats the epoch's first positions (``q mod n``), whatever ``start`` is."""
    n = len(order)
    rest = n - start
    per_rank = rest // world if drop_last else math.ceil(rest / world)
    total = per_rank * world
    return [order[(start + q) % n] for q in range(total)][rank:total:world]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("n", [0, 1, 7, 10, 33])
def test_a_pass_order_is_what_its_sampler_hands_out(order: str, n: int) -> None:
    data = TensorDataset(torch.arange(float(n)))
    for world in (1, 2, 3, 4):
        for shuffle in (False, True):
            for drop_last in (False, True):
                for start in sorted({0, min(3, n), n}):
                    for rank in range(world):
                        s = ShardSampler(data, world, rank, shuffle, 5, drop_last, order=order)
                        s.resume_at(2, start)
                        whole = s.global_order()
                        p = s.pass_order()
                        got = list(s)
                        assert got == reference(whole, start, world, rank, drop_last)
                        assert p.indices(0, len(s)).tolist() == got
                        cut = len(s) // 2  # any split of the pass: the same indices
                        parts = p.indices(0, cut).tolist() + p.indices(cut, len(s)).tolist()
                        assert parts == got
                        assert p.padding == s.padding and p.real == len(s) - s.padding


def test_a_pass_order_answers_after_its_sampler_moved_on() -> None:
    s = ShardSampler(TensorDataset(torch.arange(20.0)), 2, 1, True, 3, order="bijection")
    s.set_epoch(4)
    p = s.pass_order()
    assert s.pass_order() is p  # one object per pass, shared with the iteration
    first = list(s)
    s.set_epoch(5)
    assert s.pass_order() is not p and list(s) != first
    assert p.indices(0, len(first)).tolist() == first  # the earlier pass, as it was
    assert (p.epoch, p.start, p.rank, p.world_size) == (4, 0, 1, 2)
    s.resume_at(5, 6)
    assert s.pass_order().start == 6 and s.pass_order().num_samples == 7
    with pytest.raises(IndexError, match="outside this pass"):
        p.indices(3, 11)


def test_an_unresumed_randperm_pass_is_distributed_samplers() -> None:
    """Start 0, order "randperm": exactly torch's DistributedSampler, padding included."""
    for n in (1, 5, 7, 10, 257):
        data = TensorDataset(torch.arange(float(n)))
        for world in (2, 3, 4):
            for rank in range(world):
                for shuffle in (False, True):
                    ours = ShardSampler(data, world, rank, shuffle, 5, order="randperm")
                    theirs = DistributedSampler(data, world, rank, shuffle=shuffle, seed=5)
                    ours.set_epoch(3)
                    theirs.set_epoch(3)
                    assert list(ours) == list(theirs), (n, world, rank, shuffle)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.integers(1, 400), world=st.integers(1, 4), batch=st.integers(1, 16),
       shuffle=st.booleans(), drop_last=st.booleans(), order=st.sampled_from(ORDERS),
       data=st.data())
@example(n=257, world=2, batch=4, shuffle=True, drop_last=False, order="bijection",
         data=None).via("the issue's case")
@example(n=250, world=3, batch=4, shuffle=True, drop_last=False, order="bijection",
         data=None).via("the issue's case")
@example(n=253, world=3, batch=5, shuffle=False, drop_last=False, order="randperm",
         data=None).via("the issue's case")
def test_a_resumed_pass_continues_the_uninterrupted_one(
        n: int, world: int, batch: int, shuffle: bool, drop_last: bool, order: str,
        data: st.DataObject | None) -> None:
    """Resumed after any whole number of batches at the same world size, every rank hands
    out exactly the rest of what the uninterrupted pass hands out: padding repeats included
    (they wrap to the epoch's first positions, not to the resume position). Before, a pass
    resumed with n % world != 0 padded with other samples (257 samples at 2 ranks: rank 1's
    last sample was index 83 where the uninterrupted pass had 77)."""
    ds = TensorDataset(torch.arange(float(n)))
    passes = []
    for rank in range(world):
        s = ShardSampler(ds, world, rank, shuffle, 11, drop_last, order=order)
        s.set_epoch(2)
        passes.append(list(s))
    size = len(passes[0])
    batches = size // batch if drop_last else math.ceil(size / batch)
    cuts = range(batches + 1) if data is None else [data.draw(st.integers(0, batches))]
    for done in cuts:  # batches every rank had read when the run was killed
        consumed = min(done * batch * world, n)
        for rank in range(world):
            s = ShardSampler(ds, world, rank, shuffle, 11, drop_last, order=order)
            s.resume_at(2, consumed)
            assert list(s) == passes[rank][done * batch:], (done, rank)
            assert s.padding == s.pass_order().padding


@settings(max_examples=30, deadline=None, derandomize=True)
@given(n=st.integers(1, 400), world=st.integers(1, 4), new_world=st.integers(1, 4),
       shuffle=st.booleans(), start=st.integers(0, 400))
def test_a_pass_resumed_at_another_world_size_trains_every_sample_once(
        n: int, world: int, new_world: int, shuffle: bool, start: int) -> None:
    """At another world size the rest of the epoch is dealt anew: with the positions already
    consumed, every sample once, and the padding repeats the epoch's first positions."""
    ds = TensorDataset(torch.arange(float(n)))
    start = start % (n + 1)
    whole = ShardSampler(ds, 1, 0, shuffle, 4, order="bijection")
    whole.set_epoch(1)
    order = list(whole)
    rest: list[int] = []
    padding: list[int] = []
    for rank in range(new_world):
        s = ShardSampler(ds, new_world, rank, shuffle, 4, order="bijection")
        s.resume_at(1, start)
        got = list(s)
        real = len(got) - s.padding
        rest += got[:real]
        padding += got[real:]
    assert sorted(order[:start] + rest) == list(range(n))
    # the epoch's first positions (more than once round when there are more ranks than samples)
    assert sorted(padding) == sorted(order[i % n] for i in range(len(padding)))
