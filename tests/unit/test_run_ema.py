"""run.ema in one process: the formula, skipped GradScaler steps, registration, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.run.step import StepPlan
from splitsync.train.precision import Precision


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))


def _step(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    run.backward(model(torch.randn(6, 4)).pow(2).mean())
    run.step(opt)


def test_ema_formula_registration_and_export(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    with ss.init(seed=0) as run:
        model = run.model(_net())
        ema = run.ema(model, decay=0.5)
        slow = run.ema(model, decay=0.9)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        assert ema is not model and all(not p.requires_grad for p in ema.parameters())
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        for _ in range(3):
            _step(run, model, opt)
            for k, w in model.state_dict().items():
                expected[k] = 0.5 * expected[k] + 0.5 * w if w.is_floating_point() else w
        for k, v in ema.state_dict().items():
            assert torch.allclose(v, expected[k], atol=1e-6), k
        assert ema.state_dict()["1.num_batches_tracked"] == 3  # counters are copied
        # run.resume registers both EMAs under free names, next to the user's own "ema"
        other = nn.Linear(1, 1)
        state = run.resume(tmp_path / "ck", model=model, optimizer=opt, ema=other)
        assert not state.resumed
        ck = run._checkpoints
        assert ck.models == {"model": model, "ema": other, "ema_1": ema, "ema_2": slow}
        late = run.ema(model)  # after run.resume: registered then, under the next free name
        assert ck.models["ema_3"] is late
        # run.export(path) still means the user's models (here two: model and their "ema")
        with pytest.raises(TypeError, match="it has 2"):
            run.export(tmp_path / "w.safetensors")
        run.export(tmp_path / "e.safetensors", model=ema)
        assert torch.equal(load_file(tmp_path / "e.safetensors")["0.weight"], ema[0].weight)


def test_ema_bad_input_names_the_fix() -> None:
    with ss.init(seed=0) as run:
        with pytest.raises(TypeError, match=r"not returned by run\.model\(\).*run\.ema\(model\)"):
            run.ema(_net())
        model = run.model(_net())
        for bad in (1.5, -0.1, "0.9", True):
            with pytest.raises(ValueError, match="decay"):
                run.ema(model, decay=bad)  # type: ignore[arg-type]


def test_step_plan_knows_a_skipped_gradscaler_step() -> None:
    scaled = Precision("16-mixed", "cpu", None, None, True)  # a CPU GradScaler, as on CUDA
    plan = StepPlan(scaled, accumulate=2)
    w = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)
    plan.backward((w * 2).sum())
    plan.step(opt)
    assert not plan.stepped  # an accumulation micro-step
    plan.backward((w * 2).sum())
    plan.step(opt)
    assert plan.stepped and not torch.equal(w.detach(), torch.ones(2))
    before = w.detach().clone()
    plan.backward((w * float("inf")).sum())
    plan.backward((w * 2).sum())
    plan.step(opt)
    assert not plan.stepped and torch.equal(w.detach(), before)  # inf: the scaler skipped it
    assert StepPlan(Precision("32", "cpu", None, None, False), accumulate=1).stepped


def test_ema_of_an_activation_checkpointed_model() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tanh(self.fc(x))

    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Sequential(Block(), Block(), nn.Linear(4, 1)),
                          activation_checkpointing=True)
        ema = run.ema(model, decay=0.0)  # decay 0: the EMA is the weights after each step
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _step(run, model, opt)
        x = torch.randn(3, 4)
        with torch.no_grad():
            assert torch.allclose(ema(x), model(x), atol=1e-6)  # its own weights, same values
        assert all(torch.equal(a, b) for a, b in zip(ema.parameters(), model.parameters(),
                                                     strict=True))


def test_ema_every_warmup_and_decay_by_optimizer_step_under_accumulation(tmp_path: Path) -> None:
    """every=2, warmup=2 and a decay function count optimizer steps (not micro-steps, here
    two per step), and a resumed run continues the same schedule."""
    seen: list[int] = []

    def decay(step: int) -> float:
        seen.append(step)
        return 1 - 1 / (step + 1)

    def expected_after(steps: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        ema: dict[str, torch.Tensor] = {}
        for n, w in enumerate(steps, start=1):
            if n <= 2:
                ema = {k: v.clone() for k, v in w.items()}
            elif n % 2 == 0:
                d = 1 - 1 / (n + 1)
                ema = {k: d * ema[k] + (1 - d) * v if v.is_floating_point() else v
                       for k, v in w.items()}
        return ema

    weights: list[dict[str, torch.Tensor]] = []
    with ss.init(seed=0, accumulate=2) as run:
        model = run.model(_net())
        ema = run.ema(model, decay=decay, every=2, warmup=2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(tmp_path / "ck", model=model, optimizer=opt)
        for i in range(12):  # 6 optimizer steps
            _step(run, model, opt)
            if i % 2 == 1:
                weights.append({k: v.clone() for k, v in model.state_dict().items()})
            if i == 7:
                run.save()  # after optimizer step 4
                at_save = {k: v.clone() for k, v in ema.state_dict().items()}
        assert seen == [4, 6]  # steps 1-2 copy (warm-up), odd steps skip (every=2)
        want = expected_after(weights)
        for k, v in ema.state_dict().items():
            assert torch.allclose(v, want[k], atol=1e-6), k
        assert not torch.equal(ema[0].weight, model[0].weight)
    with ss.init(seed=0, accumulate=2) as run:  # resumed at step 4: step 6 updates, 5 not
        model = run.model(_net())
        again = run.ema(model, decay=decay, every=2, warmup=2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        assert run.resume(tmp_path / "ck", model=model, optimizer=opt).step == 4
        assert all(torch.equal(v, at_save[k]) for k, v in again.state_dict().items())
        seen.clear()
        for _ in range(4):
            _step(run, model, opt)
        assert seen == [6]


def test_ema_schedule_bad_input_names_the_fix() -> None:
    with ss.init(seed=0) as run:
        model = run.model(_net())
        for bad in ({"every": 0}, {"warmup": -1}, {"every": 1.5}):
            with pytest.raises(ValueError, match=next(iter(bad))):
                run.ema(model, **bad)  # type: ignore[arg-type]
        ema = run.ema(model, decay=lambda step: 2.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ValueError, match=r"returned 2\.0 at optimizer step 1"):
            _step(run, model, opt)
        assert ema is not model


def test_sync_batchnorm_stats_alone_is_a_no_op_that_returns_the_module() -> None:
    with ss.init(seed=0) as run:
        model = run.model(_net())
        before = model[1].running_mean.clone()
        assert run.sync_batchnorm_stats(model) is model
        assert torch.equal(model[1].running_mean, before)
        plain = nn.Linear(2, 2)
        assert run.sync_batchnorm_stats(plain) is plain
