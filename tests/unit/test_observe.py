"""Observers of a run in one process: which hooks fire, in which order, and what it costs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.observe import Observer


class Tape(Observer):
    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events

    def on_model(self, module: nn.Module) -> None:
        self.events.append(f"{self.name}:model")

    def on_wrapped(self, model: nn.Module) -> nn.Module:
        self.events.append(f"{self.name}:wrapped")
        return model

    def loader_kwargs(self, kwargs: dict) -> dict:
        return {**kwargs, "batch_size": 2}

    def on_loader_iter(self, loader: object) -> None:
        self.events.append(f"{self.name}:iter")

    def epochs(self, start: int, stop: int) -> int:
        return min(stop, start + 1)

    def on_epoch(self, epoch: int) -> None:
        self.events.append(f"{self.name}:epoch{epoch}")

    def on_backward(self, loss: torch.Tensor, loader: object) -> None:
        self.events.append(f"{self.name}:backward:{loader is not None}")

    def on_step_begin(self, optimizer: object) -> None:
        self.events.append(f"{self.name}:step")

    def on_step_end(self, optimizer: object, norm: object) -> None:
        self.events.append(f"{self.name}:stepped:{norm is not None}")

    def around_collective(self, op: str, fn, *args):  # type: ignore[no-untyped-def]
        self.events.append(f"{self.name}:{op}")
        return fn(*args)

    def on_log(self, record: object) -> None:
        self.events.append(f"{self.name}:log")

    def on_save(self, path: Path, step: int) -> None:
        self.events.append(f"{self.name}:save{step}")

    def on_close(self, clean: bool) -> None:
        self.events.append(f"{self.name}:close:{clean}")


def test_every_hook_fires_in_order_and_close_runs_in_reverse(tmp_path: Path) -> None:
    events: list[str] = []
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.randn(8, 1))
    with ss.init(seed=0, guards=False, run_dir=str(tmp_path)) as run:
        clock = run.observers  # with a run_dir: the goodput clock (where the time went)
        assert [type(o).__name__ for o in clock] == ["GoodputClock"]
        a, b = run.add_observer(Tape("a", events)), run.add_observer(Tape("b", events))
        assert run.observers == (*clock, a, b)
        model = run.model(nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(tmp_path / "ckpt", model=model, optimizer=opt)
        loader = run.loader(data, batch_size=4, shuffle=True)
        assert loader.batch_size == 2  # adjusted by the observers
        for _ in run.epochs(5):  # shortened to one epoch
            for x, y in loader:
                run.backward(nn.functional.mse_loss(model(x), y))
                run.step(opt, clip=1.0)
                break
        run.mean(torch.tensor(1.0))
        run.log(loss=1.0)
        run.save()
        events.append("--")
    assert events[:4] == ["a:model", "b:model", "a:wrapped", "b:wrapped"]
    assert "a:epoch0" in events and "a:epoch1" not in events
    assert events.index("a:iter") < events.index("a:backward:True") < events.index("a:step")
    assert "a:stepped:True" in events and "b:all_reduce" in events
    assert events.index("a:log") < events.index("a:save1") < events.index("--")
    assert events[-2:] == ["b:close:True", "a:close:True"]


def test_without_observers_the_hot_path_is_the_plain_plan() -> None:
    with ss.init(seed=0, guards=False) as run:
        assert run.observers == ()
        assert run._training.backward is run._plan.backward
        assert run._training.step == run._plan.step
        obs = run.add_observer(Tape("a", []))
        assert run._training.backward is not run._plan.backward
        run.remove_observer(obs)
        assert run._training.backward is run._plan.backward
        with pytest.raises(TypeError, match="Observer"):
            run.add_observer(object())  # type: ignore[arg-type]


def test_a_hook_not_overridden_is_never_called() -> None:
    class OnlyLog(Observer):
        def __init__(self) -> None:
            self.records: list[dict] = []

        def on_log(self, record: dict) -> None:  # type: ignore[override]
            self.records.append(dict(record))

    with ss.init(seed=0, guards=False) as run:
        obs = run.add_observer(OnlyLog())
        assert run._training.backward is run._plan.backward  # backward untouched
        run.log(acc=0.5)
        assert obs.records == [{"acc": 0.5}]


def test_log_extra_rides_in_run_logs_reduce_and_comes_back(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    import splitsync.output.metrics as metrics

    class Rider(Observer):
        def __init__(self, values: list[float]) -> None:
            self.values, self.back = values, []  # type: list[float], list[list[float]]

        def log_extra(self) -> list[float]:
            return self.values

        def on_log_extra(self, means: list[float]) -> None:
            self.back.append(means)

    reduced: list[int] = []
    real = metrics.comm.reduce
    monkeypatch.setattr(metrics.comm, "reduce",
                        lambda t, op, dev: reduced.append(t.numel()) or real(t, op, dev))
    with ss.init(seed=0, guards=False) as run:
        a, b = run.add_observer(Rider([1.0, 2.0])), run.add_observer(Rider([3.0]))
        assert run.log(loss=0.5, step=3) == {"loss": 0.5, "step": 3}
        assert reduced == [5]  # one collective: two metrics and three extras
        assert a.back == [[1.0, 2.0]] and b.back == [[3.0]]
        run.log()  # nothing to reduce: no collective, the riders are not asked
        assert reduced == [5] and len(a.back) == 1
        run.remove_observer(a)
        run.remove_observer(b)
        run.log(loss=0.5)
        assert reduced == [5, 1]


class _Stepped(Observer):
    """Today's signature: learns whether the optimizer really stepped."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def on_step_end(self, optimizer: object, norm: object, stepped: bool = True) -> None:
        self.seen.append(stepped)


class _OldSignature(Observer):
    """An observer written before ``stepped`` existed keeps working, unchanged."""

    def __init__(self) -> None:
        self.calls = 0

    def on_step_end(self, optimizer: object, norm: object) -> None:  # type: ignore[override]
        self.calls += 1


def test_step_end_tells_micro_steps_from_steps_and_keeps_old_observers_working() -> None:
    with ss.init(seed=0, guards=False, accumulate=2) as run:
        new, old = run.add_observer(_Stepped()), run.add_observer(_OldSignature())
        model = run.model(nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            run.backward(model(torch.randn(2, 3)).pow(2).mean())
            run.step(opt)
    assert new.seen == [False, True, False, True]
    assert old.calls == 4


def test_a_step_the_grad_scaler_skips_did_not_step() -> None:
    """Inf gradients: GradScaler skips optimizer.step, and the plan says so (CPU scaler)."""
    from splitsync.run.step import StepPlan
    from splitsync.train.precision import Precision

    plan = StepPlan(Precision("16-mixed", "cpu", None, None, scaled=True), accumulate=1)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    plan.backward(model(torch.randn(2, 3)).sum() * float("inf"))
    plan.step(opt)
    assert not plan.stepped and torch.equal(model.weight, before)
    plan.backward(model(torch.randn(2, 3)).pow(2).mean())
    plan.step(opt)
    assert plan.stepped and not torch.equal(model.weight, before)
