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
from splitsync.tools.audit.audit import audit
from splitsync.tools.audit.ledger import recorder
from splitsync.tools.audit.ledger.format import MAGIC, rank_file, read_file


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


class Stepped(Observer):
    """Which run.step calls really stepped (the core's word), in order."""

    def __init__(self) -> None:
        self.stepped: list[bool] = []

    def on_step_end(self, optimizer: object, norm: object, stepped: bool = True) -> None:
        self.stepped.append(stepped)


def by_step(path: Path) -> dict[tuple[int, int, int], list[int]]:
    """The ledger's ids per (step, loader, epoch), in order."""
    out: dict[tuple[int, int, int], list[int]] = {}
    for kind, r in read_file(path).records:
        if kind == "S":
            out.setdefault((r.step, r.loader, r.epoch), []).extend(r.ids.tolist())
    return out


def test_map_style_batches_cost_the_ledger_no_call(tmp_path: Path) -> None:
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path)) as run:
        loader = run.loader(Indexed(), batch_size=3, shuffle=True)
        assert loader.hooks.on_batch == ()  # nobody hears map-style batches one by one
        assert [type(o).__name__ for o in loader.hooks.on_stream_batch] == ["Ledger"]
        for _ in loader:
            assert loader.sampler is not None and loader.sampler.tap is None  # no ids drawn


@pytest.mark.parametrize("flush", [None, (2, 5)])
def test_steps_get_what_each_pass_delivered_before_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush: tuple[int, int] | None) -> None:
    # accumulate=2 over 5 batches a pass: a window spans two passes; an evaluation pass
    # with no step (train= not said) is found and credited to no step; a pass left after
    # 3 batches, another begun;
    # and the same with writes every 2 steps or 5 ids, cutting runs of steps in between
    if flush is not None:
        monkeypatch.setattr(recorder, "FLUSH_STEPS", flush[0])
        monkeypatch.setattr(recorder, "FLUSH_IDS", flush[1])
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path), accumulate=2) as run:
        watch = run.add_observer(Stepped())
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train = run.loader(Indexed(), batch_size=2, shuffle=True)
        evaluate = run.loader(Indexed(), batch_size=4)
        truth: dict[tuple[int, int, int], list[int]] = {}
        held: list[tuple[int, int, list[int]]] = []  # delivered since the last real step

        def step(x: torch.Tensor) -> None:
            run.backward(model(x).sum())
            run.step(opt)
            if watch.stepped[-1]:
                n = sum(watch.stepped)
                for k, epoch, ids in held:
                    truth.setdefault((n, k, epoch), []).extend(ids)
                held.clear()

        for epoch in run.epochs(2):
            for x, i in train:
                held.append((0, epoch, i.tolist()))
                step(x)
            for _ in evaluate:  # never followed by a run.step: evaluation, not trained
                pass
        train.set_epoch(2)
        for k, (x, i) in enumerate(train):
            held.append((0, 2, i.tolist()))
            step(x)
            if k == 2:
                break
        for x, i in train:  # a new pass of epoch 2 from its start
            held.append((0, 2, i.tolist()))
            step(x)
    assert sum(watch.stepped) == 9 and not held
    assert by_step(rank_file(tmp_path / "ledger", 1, 0)) == truth
    assert (3, 0, 0) in truth and (3, 0, 1) in truth  # the window across passes
    assert not any(loader == 1 for _, loader, _ in truth)  # the evaluation pass: no step


def test_a_resume_drops_what_was_delivered_before_it(tmp_path: Path) -> None:
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path)) as run:
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(tmp_path / "ckpt", model=model, optimizer=opt)
        loader = run.loader(Indexed(), batch_size=2)  # unshuffled: batch k holds 2k, 2k+1
        evaluate = run.loader(Indexed(), batch_size=5)
        it = iter(loader)
        for _ in range(2):
            x, _ = next(it)
            run.backward(model(x).sum())
            run.step(opt)
        run.save()
        next(it)  # delivered, never stepped on
        for _ in evaluate:  # a whole pass delivered, never stepped on
            pass
        state = run.resume(tmp_path / "ckpt", model=model, optimizer=opt)
        assert state.step == 2
        x, _ = next(it)
        run.backward(model(x).sum())
        run.step(opt)
    assert by_step(rank_file(tmp_path / "ledger", 1, 0)) == {
        (1, 0, 0): [0, 1], (2, 0, 0): [2, 3], (3, 0, 0): [6, 7]}


class Nine(Dataset):
    def __len__(self) -> int:
        return 9

    def __getitem__(self, i: int) -> int:
        return i


def test_padding_short_batches_and_a_write_between_passes(tmp_path: Path) -> None:
    # rank 1 of 2 over 9 samples: 4 of its own and 1 padding repeat, batches of 2, 2, 1
    from splitsync.data.build import LoaderHooks, make_loader

    ledger = recorder.Ledger(tmp_path, rank=1, world_size=2)
    hooks = LoaderHooks()
    hooks.on_iter = (ledger,)
    loader = make_loader(Nine(), 2, shuffle=True, drop_last=False, num_workers=0,
                         collate_fn=None, rank=1, world_size=2, seed=3,
                         device=torch.device("cpu"), hooks=hooks)
    got = []
    for i in loader:
        got.append(i.tolist())
        ledger.on_step_end(None, None)  # type: ignore[arg-type]
    ledger.on_step_end(None, None)  # type: ignore[arg-type]  # steps with nothing new
    it = iter(loader)
    got.append(next(it).tolist())  # a batch, then another pass before the step
    it = iter(loader)
    ledger.before_save(None)  # a write: that batch is not the written steps' yet
    got.append(next(it).tolist())
    ledger.on_step_end(None, None)  # type: ignore[arg-type]
    ledger.on_step_end(None, None, stepped=False)  # type: ignore[arg-type]  # a window opens
    got.append(next(it).tolist())
    ledger.before_save(None)  # a save inside it: its batch goes to the checkpoint's step
    ledger.on_step_end(None, None)  # type: ignore[arg-type]
    ledger.on_close(True)
    steps = [r for k, r in read_file(ledger.path).records if k == "S"]
    assert [(s.step, len(s.ids), s.padded) for s in steps] == [
        (1, 2, 0), (2, 2, 0), (3, 1, 1), (5, 4, 0), (5, 2, 0)]
    assert [s.ids.tolist() for s in steps] == [*got[:3], got[3] + got[4], got[5]]
    assert got[2] == loader.sampler.global_order()[:1]  # the padding repeats the first


@pytest.mark.parametrize("stream", [False, True], ids=["map", "stream"])
def test_the_last_partial_window_steps_and_the_audit_passes(tmp_path: Path,
                                                            stream: bool) -> None:
    """10 samples (15 for the stream) in batches of 3: 4 (5) micro-batches an epoch, 2 epochs,
    accumulate=3. The run's last window holds 2 micro-batches (1 for the stream): it steps
    on the last batch, with the gradients' mean over what it holds, and the audit of the
    clean run passes (before, those micro-batches never stepped: gaps, FAILED)."""
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path), accumulate=3) as run:
        watch = run.add_observer(Stepped())
        model = run.model(nn.Linear(2, 1, bias=False))
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        loader = run.loader(Stream() if stream else Indexed(), batch_size=3)
        for _ in run.epochs(2):
            for x, _ in loader:
                run.backward(model(x).sum())
                synced = run.sync_gradients
                before = model.weight.detach().clone()
                grad = model.weight.grad.clone()
                run.step(opt)
                assert synced == watch.stepped[-1]
        change = model.weight.detach() - before
    micro = 10 if stream else 8
    held = micro % 3
    assert len(watch.stepped) == micro and sum(watch.stepped) == micro // 3 + 1
    assert watch.stepped[-1] and watch.stepped[-held - 1] and not any(watch.stepped[-held:-1])
    # each loss was divided by 3; the last window's step takes the mean over what it held
    assert torch.allclose(change, -grad * 3 / held)
    rep = audit(tmp_path)
    assert rep.ok, rep
    assert [e.status for e in rep.epochs] == ["exactly once"] * 2


def test_a_save_inside_a_window_credits_its_samples_and_a_resume_audits_clean(
        tmp_path: Path) -> None:
    """accumulate=2 over 4 batches an epoch: a save after the 3rd micro-batch keeps the open
    window (its gradients are in the checkpoint); its samples go to the step the checkpoint
    is named after, so when the run is killed after the next step and resumed from the
    save, the audit counts every sample once (before: that micro-batch's samples were
    nobody's, and the resumed loader looked ahead of the committed steps)."""
    ckpt = tmp_path / "ckpt"

    def lifetime(stop_after: int | None) -> None:
        with ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path),
                     accumulate=2) as run:
            model = run.model(nn.Linear(2, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = run.loader(Indexed(), batch_size=3, shuffle=True)
            state = run.resume(ckpt, model=model, optimizer=opt)
            micro = int(state.extra.get("micro", 0))
            for _ in run.epochs(2, start=state.epoch):
                for x, _ in loader:
                    run.backward(model(x).sum())
                    run.step(opt)
                    micro += 1
                    if micro == 3:
                        run.save(micro=micro)  # inside the window of micro-batches 3 and 4
                    if micro == stop_after:
                        return  # killed: the step of micro-batch 4 is lost

    lifetime(stop_after=4)
    lifetime(stop_after=None)
    rep = audit(tmp_path)
    assert rep.ok, (rep.findings, rep.first_bad)
    assert [e.status for e in rep.epochs] == ["exactly once"] * 2
