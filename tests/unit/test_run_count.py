"""``run.backward(loss, count=n)`` in one process: the global mean over items, empty
micro-batches and steps, clipping, EMA, mixing, bad counts, exact resume, observers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import splitsync as ss
from splitsync.observe import Observer
from splitsync.run.counting import unit_for
from splitsync.run.step import _plain_backward

VOCAB, SEQ = 11, 6


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 5), nn.Linear(5, VOCAB)).double()


def _batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (len(lengths), SEQ), generator=g)
    mask = (torch.arange(SEQ)[None] < torch.tensor(lengths)[:, None]).double()
    return tokens, mask


def _loss(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_token = F.cross_entropy(model(tokens).transpose(1, 2), tokens, reduction="none")
    return (per_token * mask).sum() / mask.sum()  # NaN for a micro-batch without tokens


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _reference(steps: list[list[int]], clip: float | None = None) -> tuple[torch.Tensor, list]:
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    norms = []
    for s, lengths in enumerate(steps):
        if sum(lengths) == 0:
            continue  # a step without any token does not step
        _loss(model, *_batch(lengths, s)).backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        opt.zero_grad()
    return _flat(model), norms


def _train(run: ss.Run, steps: list[list[int]], k: int, clip: float | None = None,
           model: nn.Module | None = None, opt: Any = None,
           first: int = 0) -> tuple[nn.Module, list]:
    model = model if model is not None else run.model(_net())
    opt = opt if opt is not None else torch.optim.AdamW(model.parameters(), lr=0.05)
    norms = []
    for s, lengths in enumerate(steps):
        tokens, mask = _batch(lengths, first + s)
        size = len(lengths) // k
        for m in range(k):
            part = slice(m * size, (m + 1) * size)
            run.backward(_loss(model, tokens[part], mask[part]), count=int(mask[part].sum()))
            norm = run.step(opt, clip=clip).norm
        if norm is not None:
            norms.append(float(norm))
    return model, norms


STEPS = [[6, 1, 0, 0, 3, 5], [0, 0, 2, 6, 6, 4], [0, 0, 0, 0, 0, 0], [1, 2, 3, 0, 0, 1]]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_accumulation_equals_the_global_mean_over_tokens_with_clip(k: int) -> None:
    ref, ref_norms = _reference(STEPS, clip=0.05)
    with ss.init(seed=0, accumulate=k) as run:
        model, norms = _train(run, STEPS, k, clip=0.05)
    assert (_flat(model) - ref).abs().max().item() <= 1e-12
    assert norms == pytest.approx(ref_norms, rel=1e-12)  # the clipped norm: the global mean's


def test_one_process_without_accumulation_is_the_plain_backward_bit_for_bit() -> None:
    with ss.init(seed=0) as run:
        assert run._training.backward is _plain_backward  # nothing changes without count=
        counted, _ = _train(run, STEPS[:2], 1)
        plain = run.model(_net())
        opt = torch.optim.AdamW(plain.parameters(), lr=0.05)
        for s, lengths in enumerate(STEPS[:2]):
            run.backward(_loss(plain, *_batch(lengths, s)))
            run.step(opt)
    assert torch.equal(_flat(counted), _flat(plain))


class Steps(Observer):
    def __init__(self) -> None:
        self.stepped: list[bool] = []
        self.counts: list[float] = []

    def on_backward(self, loss: torch.Tensor, loader: Any, count: float | None = None) -> None:
        self.counts.append(count)  # type: ignore[arg-type]

    def on_step_end(self, optimizer: Any, norm: Any, stepped: bool = True) -> None:
        self.stepped.append(stepped)


class OldObserver(Observer):
    def __init__(self) -> None:
        self.calls = 0

    def on_backward(self, loss: torch.Tensor, loader: Any) -> None:
        self.calls += 1


def test_a_step_without_any_token_does_not_step_nor_move_the_ema() -> None:
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        ema = run.ema(model, decay=0.5)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        watch, old = run.add_observer(Steps()), run.add_observer(OldObserver())
        _train(run, STEPS[:2], 2, model=model, opt=opt)
        before, ema_before = _flat(model), _flat(ema)
        _train(run, [STEPS[2]], 2, model=model, opt=opt)  # no token anywhere
        assert torch.equal(_flat(model), before) and torch.equal(_flat(ema), ema_before)
        assert not any(torch.isnan(p).any() for p in model.parameters())
        assert [float(s["step"]) for s in opt.state.values()][:1] == [2.0]
        assert all(p.grad is None for p in model.parameters())
    assert watch.stepped == [False, True, False, True, False, False]
    assert watch.counts == [7.0, 8.0, 2.0, 16.0, 0.0, 0.0]  # observers see the counts
    assert old.calls == 6  # an override without count= is still called


def test_mixing_count_and_no_count_in_one_window_is_refused() -> None:
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        tokens, mask = _batch([3, 4], 0)
        run.backward(_loss(model, tokens, mask), count=7)
        with pytest.raises(ValueError, match="mixes micro-batches with and without count="):
            run.backward(_loss(model, tokens, mask))
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.backward(_loss(model, tokens, mask), count=7)
        run.backward(_loss(model, tokens, mask), count=7)
        run.step(opt)
        run.backward(_loss(model, tokens, mask))  # a new window may go without
        with pytest.raises(ValueError, match="give count= on every micro-batch"):
            run.backward(_loss(model, tokens, mask), count=7)


@pytest.mark.parametrize(("count", "error", "text"), [
    (-1, ValueError, "finite and >= 0"),
    (float("nan"), ValueError, "finite and >= 0"),
    (True, TypeError, "number of items"),
    ("8", TypeError, "number of items"),
    (torch.ones(2), ValueError, "shape (2,)"),
])
def test_bad_counts_are_refused_with_the_fix(count: Any, error: type, text: str) -> None:
    with ss.init(seed=0) as run:
        model = run.model(_net())
        with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
            run.backward(_loss(model, *_batch([3], 0)), count=count)


def test_count_zero_needs_a_loss_with_a_graph() -> None:
    with ss.init(seed=0) as run, pytest.raises(ValueError, match="has no graph"):
        run.backward(torch.tensor(0.0), count=0)


def test_a_resumed_run_trains_bit_for_bit_like_the_straight_one(tmp_path: Path) -> None:
    # The multiplier's unit adapts to the counts seen (a power of two); a resumed run starts
    # again at 1, which changes no bit of the result.
    with ss.init(seed=0, accumulate=2) as run:
        straight, _ = _train(run, STEPS + STEPS, 2)
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        run.resume(tmp_path, model=model, optimizer=opt)
        _train(run, STEPS, 2, model=model, opt=opt)
        run.save(tmp_path)
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        run.resume(tmp_path, model=model, optimizer=opt)
        _train(run, STEPS, 2, model=model, opt=opt, first=len(STEPS))
    assert torch.equal(_flat(model), _flat(straight))


def _counted(run: ss.Run, parts: list[list[int]], first: int = 0,
             model: nn.Module | None = None, opt: Any = None) -> tuple[nn.Module, Any]:
    """One counted micro-batch of sequences of these lengths per entry, then run.step."""
    model = model if model is not None else run.model(_net())
    opt = opt if opt is not None else torch.optim.AdamW(model.parameters(), lr=0.05)
    for i, lengths in enumerate(parts, start=first):
        run.backward(_loss(model, *_batch(lengths, i)), count=sum(lengths))
        run.step(opt)
    return model, opt


def test_a_save_inside_a_counted_window_keeps_its_items_and_unit(tmp_path: Path) -> None:
    # 4 windows of 2: the unit is 1/8 after the first, 1/16 after the second; the save falls
    # after the third's first micro-step (12 items), the resumed run goes on from there
    parts = [[6, 1], [0, 3], [5, 6], [4, 4], [6, 6], [1, 0], [2, 0], [0, 0]]
    with ss.init(seed=0, accumulate=2) as run:
        straight, _ = _counted(run, parts)
    with ss.init(seed=0, accumulate=2) as run:
        _counted(run, parts[:5])
        run.save(tmp_path)
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        run.resume(tmp_path, model=model, optimizer=opt)
        counting = run._training.plan.counting  # armed by the resume
        assert (counting.unit, counting.local) == (unit_for(19, 1), 12.0) == (1 / 16, 12.0)
        assert not run.sync_gradients
        _counted(run, parts[5:], first=5, model=model, opt=opt)
    assert torch.equal(_flat(model), _flat(straight))


def test_a_resumed_counted_window_refuses_a_backward_without_count(tmp_path: Path) -> None:
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        run.backward(_loss(model, *_batch([3, 4], 0)), count=7)
        run.save(tmp_path, step=0)
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        run.resume(tmp_path, model=model)
        with pytest.raises(ValueError, match="mixes micro-batches with and without count="):
            run.backward(_loss(model, *_batch([3, 4], 1)))


class Sequences(torch.utils.data.Dataset):
    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, mask = _batch([self.lengths[i]], i)
        return tokens[0], mask[0]


def test_an_uncounted_last_window_after_counted_ones_is_its_micro_batches_mean() -> None:
    # 3 micro-batches, accumulate 2: a counted window, then the run's last, of one
    # uncounted micro-batch, which steps on the mean of its loss (not half of it)
    lengths = [4, 2, 5, 1, 3, 6]
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        loader = run.loader(Sequences(lengths), batch_size=2, shuffle=False)
        for _ in run.epochs(1):
            for i, (tokens, mask) in enumerate(loader):
                if i < 2:
                    run.backward(_loss(model, tokens, mask), count=int(mask.sum()))
                else:
                    run.backward(_loss(model, tokens, mask))
                assert run.step(opt).stepped == (i > 0)
    ref, data = _net(), Sequences(lengths)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for part in (range(0, 4), range(4, 6)):  # the global batch of each step, in one
        tokens, mask = (torch.stack(t) for t in zip(*(data[i] for i in part), strict=True))
        _loss(ref, tokens, mask).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert (_flat(model) - _flat(ref)).abs().max().item() <= 1e-12


@settings(max_examples=40, deadline=None)
@given(st.floats(min_value=1e-3, max_value=1e9), st.integers(min_value=1, max_value=64))
def test_the_unit_is_a_power_of_two_near_one_item_per_rank(total: float, world: int) -> None:
    unit = unit_for(total, world)
    mantissa, _ = __import__("math").frexp(unit)
    assert mantissa == 0.5  # a power of two: scaling by it changes no bit
    assert 0.5 <= unit * total / world <= 2.0
    assert unit_for(0.0, world) == 1.0


def test_log_count_weighs_by_items_and_reports_the_total() -> None:
    with ss.init(seed=0) as run:
        record = run.log(loss=torch.tensor(2.5), step=3, count=torch.tensor(40))
        empty = run.log(loss=float("nan"), count=0)
        with pytest.raises(ValueError, match="count of items"):
            run.log(loss=1.0, count=-2)
    assert record == {"loss": 2.5, "step": 3, "count": 40}
    assert empty["count"] == 0
