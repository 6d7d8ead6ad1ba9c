"""A pass's order: the indices a sampler hands a rank, answered by position, also later."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from splitsync.data.loader import ShardSampler
from splitsync.data.order import ORDERS


def reference(order: list[int], start: int, world: int, rank: int, drop_last: bool) -> list[int]:
    """DistributedSampler's dealing of what remains of ``order`` after ``start``."""
    rest = order[start:]
    per_rank = len(rest) // world if drop_last else math.ceil(len(rest) / world)
    total = per_rank * world
    if rest and len(rest) < total:
        rest = (rest * math.ceil(total / len(rest)))[:total]
    return rest[:total][rank:total:world]


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
