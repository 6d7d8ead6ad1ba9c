"""``init(ledger=True)`` on one process: the ids a batch carries and what the ledger writes."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

import splitsync as ss
from splitsync.data.stream import SHARD_SHIFT
from splitsync.observe import Observer
from splitsync.tools.ledger import recorder
from splitsync.tools.ledger.audit import audit
from splitsync.tools.ledger.format import MAGIC, rank_file, read_file


class Indexed(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i


class Stream(IterableDataset):
    """3 shards of 5 samples; a sample is (shard, index in shard)."""

    n_shards = 3

    def shard(self, num_shards: int, index: int):  # type: ignore[no-untyped-def]
        for i in range(5):
            yield torch.zeros(2), torch.tensor([index, i])

    def __iter__(self):  # type: ignore[no-untyped-def]
        for s in range(self.n_shards):
            yield from self.shard(self.n_shards, s)


class Ids(Observer):
    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def on_batch(self, loader: object, ids: list[int]) -> None:
        self.seen.append(torch.tensor(ids, dtype=torch.int64))


def test_batches_carry_their_sample_ids_and_steps_record_them(tmp_path: Path) -> None:
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path), accumulate=2) as run:
        tap = run.add_observer(Ids())
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(tmp_path / "ckpt", model=model, optimizer=opt)
        loader = run.loader(Indexed(), batch_size=3, shuffle=True, num_workers=2)
        trained = []
        for _ in run.epochs(1):
            for x, i in loader:
                trained.append(i)
                run.backward(model(x).sum())
                run.step(opt)
        loader.set_epoch(1)
        for x, i in loader:  # a pass outside run.epochs
            trained.append(i)
            run.backward(model(x).sum())
            run.step(opt)
        run.backward(model(x).sum())  # a window left open: no step, nothing recorded
    # the ids each batch carried are the samples it held (workers draw indices ahead)
    assert [t.tolist() for t in tap.seen] == [t.tolist() for t in trained]
    f = read_file(rank_file(tmp_path / "ledger", 1, 0))
    assert f.error is None and f.meta["world_size"] == 1
    steps = [r for k, r in f.records if k == "S"]
    # 4 batches an epoch, accumulate=2: 2 steps an epoch, each with both micro-batches
    assert [(s.step, s.epoch) for s in steps] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    assert [len(s.ids) for s in steps] == [6, 4, 6, 4]  # 10 samples: the last batch has 1
    assert steps[0].ids.tolist() == torch.cat(trained[:2]).tolist()
    assert [k for k, _ in f.records][-1] == "C"
    resumes = [r for k, r in f.records if k == "R"]  # after_resume: a fresh start at 0
    assert [(r["step"], r["resumed"]) for r in resumes] == [(0, False)]
    rep = audit(tmp_path)
    assert rep.ok and [e.status for e in rep.epochs] == ["exactly once"] * 2


def test_stream_ids_name_shard_and_position(tmp_path: Path) -> None:
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path)) as run:
        tap = run.add_observer(Ids())
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = run.loader(Stream(), batch_size=2)  # unshuffled: position = index in shard
        held = []
        for _ in run.epochs(1):
            for x, who in loader:
                held.append(who)
                run.backward(model(x).sum())
                run.step(opt)
    ids = torch.cat(tap.seen)
    who = torch.cat(held)
    assert (ids >> SHARD_SHIFT).tolist() == who[:, 0].tolist()
    assert (ids & ((1 << SHARD_SHIFT) - 1)).tolist() == who[:, 1].tolist()
    rep = audit(tmp_path)
    assert rep.ok and rep.epochs[0].samples == 15 and rep.epochs[0].once == 15
    steps = [r for k, r in read_file(rank_file(tmp_path / "ledger", 1, 0)).records if k == "S"]
    assert np.array_equal(np.concatenate([s.ids for s in steps]), ids.numpy())


def test_ledger_needs_a_run_dir_and_costs_nothing_when_off() -> None:
    with pytest.raises(ValueError, match="run_dir"):
        ss.init(seed=0, ledger=True)
    with ss.init(seed=0, guards=False) as run:
        loader = run.loader(Indexed(), batch_size=3)
        assert loader.hooks.on_batch == ()  # no listener: no ids computed
        assert loader.sampler is not None and loader.sampler.tap is None


def test_steps_reach_the_file_before_the_checkpoint_that_commits_them(tmp_path: Path) -> None:
    def steps_on_disk() -> list[int]:
        f = read_file(rank_file(tmp_path / "ledger", 1, 0))
        return [r.step for k, r in f.records if k == "S"]

    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path)) as run:
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(tmp_path / "ckpt", model=model, optimizer=opt)
        loader = run.loader(Indexed(), batch_size=2)
        for k, (x, _) in enumerate(loader):
            run.backward(model(x).sum())
            run.step(opt)
            if k == 2:
                assert steps_on_disk() == []  # buffered: no system call per step
                run.save()
                assert steps_on_disk() == [1, 2, 3]  # written before the checkpoint
                # encoded together: one record for the three steps, none per step
                assert raw_kinds(rank_file(tmp_path / "ledger", 1, 0)) == list("MRPS")
        assert steps_on_disk() == [1, 2, 3]
    assert steps_on_disk() == [1, 2, 3, 4, 5]  # and the rest at close
    assert raw_kinds(rank_file(tmp_path / "ledger", 1, 0)) == list("MRPSSC")


def raw_kinds(path: Path) -> list[str]:
    """The kind of every record in a ledger file, as written (a steps record once)."""
    data = path.read_bytes()
    pos, kinds = len(MAGIC), []
    while pos < len(data):
        kind, length, _ = struct.unpack_from("<cII", data, pos)
        kinds.append(kind.decode())
        pos += 9 + length
    return kinds


def test_a_bound_on_buffered_ids_writes_before_the_step_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder, "FLUSH_IDS", 4)  # large batches: memory stays bounded
    path = rank_file(tmp_path / "ledger", 1, 0)
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path)) as run:
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = []
        for x, _ in run.loader(Indexed(), batch_size=2):
            run.backward(model(x).sum())
            run.step(opt)
            seen.append([r.step for k, r in read_file(path).records if k == "S"])
    assert seen == [[], [1, 2], [1, 2], [1, 2, 3, 4], [1, 2, 3, 4]]
    assert raw_kinds(path) == list("MPSSSC")


def test_the_step_bound_counts_steps_since_the_last_write_across_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a pass's start writes nothing: its record waits for the next write, with the steps
    monkeypatch.setattr(recorder, "FLUSH_STEPS", 3)
    path = rank_file(tmp_path / "ledger", 1, 0)
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path)) as run:
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = run.loader(Indexed(), batch_size=2)  # 5 steps a pass
        written = []
        for _ in run.epochs(2):
            for x, _ in loader:
                run.backward(model(x).sum())
                run.step(opt)
                written.append(max((r.step for k, r in read_file(path).records if k == "S"),
                                   default=0))
    assert written == [0, 0, 3, 3, 3, 6, 6, 6, 9, 9]
    assert raw_kinds(path) == list("MPSPSSSC")
