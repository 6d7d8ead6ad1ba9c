"""Loaders built by the run: per-process batch size, re-sharding, clear refusals."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

import splitsync
from splitsync.data.loader import ShardSampler

DATA = TensorDataset(torch.arange(10.0))


def test_batches_are_per_process_and_on_device() -> None:
    with splitsync.init(seed=0) as run:
        loader = run.loader(DATA, batch_size=4)
        batches = [b[0] for b in loader]
        assert [len(b) for b in batches] == [4, 4, 2]
        assert all(b.device == run.device for b in batches)


def test_existing_dataloader_is_resharded_keeping_its_options() -> None:
    with splitsync.init(seed=0) as run:
        loader = run.loader(DataLoader(DATA, batch_size=3, shuffle=True, drop_last=True))
        assert isinstance(loader.sampler, ShardSampler) and loader.sampler.shuffle
        assert [len(b[0]) for b in loader] == [3, 3, 3]


def test_custom_batch_sampler_is_refused() -> None:
    custom = DataLoader(DATA, batch_sampler=BatchSampler(SequentialSampler(DATA), 2, False))
    with splitsync.init(seed=0) as run, pytest.raises(ValueError, match="custom batch_sampler"):
        run.loader(custom)


class Evens(torch.utils.data.Sampler[int]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(0, 10, 2))

    def __len__(self) -> int:
        return 5


def test_a_custom_sampler_gives_the_order_in_a_dataloader_or_as_an_option() -> None:
    with splitsync.init(seed=0) as run:
        loader = run.loader(DataLoader(DATA, batch_size=2, sampler=Evens()))
        assert [b[0].tolist() for b in loader] == [[0.0, 2.0], [4.0, 6.0], [8.0]]
        loader = run.loader(DATA, batch_size=2, sampler=Evens(), drop_last=True)
        assert [b[0].tolist() for b in loader] == [[0.0, 2.0], [4.0, 6.0]]
        with pytest.raises(ValueError, match="drop shuffle=True"):
            run.loader(DATA, batch_size=2, sampler=Evens(), shuffle=True)
        with pytest.raises(TypeError, match="give sampler="):
            run.loader(DATA, batch_size=2, batch_sampler=Evens())


def test_bad_batch_size() -> None:
    with splitsync.init(seed=0) as run, pytest.raises(ValueError, match="batch_size=0"):
        run.loader(DATA, batch_size=0)


@pytest.mark.parametrize("world", [2, 3])
def test_shards_pad_like_distributed_sampler(world: int) -> None:
    for drop_last in (False, True):
        ours = [list(ShardSampler(DATA, world, r, True, 7, drop_last)) for r in range(world)]
        ref = [
            list(torch.utils.data.DistributedSampler(DATA, world, r, True, 7, drop_last))
            for r in range(world)
        ]
        assert ours == ref


def test_resume_position_at_another_world_size() -> None:
    two = [ShardSampler(DATA, 2, r, True, 1) for r in range(2)]
    order = two[0].global_order()
    consumed = 4  # each rank read 2 samples
    three = [ShardSampler(DATA, 3, r, True, 1) for r in range(3)]
    for s in three:
        s.resume_at(0, consumed)
    rest = sorted(i for s in three for i in s if True)
    assert set(rest) >= set(order[consumed:])
    assert not set(order[:consumed]) & set(i for s in three for i in list(s)[: len(s) - s.padding])
    for s in three:
        s.set_epoch(1)  # the next epoch starts from its beginning
        assert s.start == 0
