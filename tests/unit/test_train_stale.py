"""run.step's first-step check of an optimizer, and DDP options under "auto" (no group)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitsync as ss


def _loss(model: nn.Module) -> torch.Tensor:
    x = torch.ones(4, 3, dtype=next(model.parameters()).dtype)
    return model(x).float().pow(2).mean()


@pytest.fixture
def new_params_on_cast():
    """Casting a module makes new parameter objects (as on devices without in-place casts)."""
    old = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    yield
    torch.__future__.set_overwrite_module_params_on_conversion(old)


def test_optimizer_on_parameters_run_model_replaced_fails_at_first_step(
        new_params_on_cast: None) -> None:
    with ss.init(seed=0, precision="bf16-true") as run:
        net = nn.Linear(3, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        model = run.model(net)
        run.backward(_loss(model))
        with pytest.raises(ss.StaleOptimizerError) as info:
            run.step(opt)
        msg = str(info.value)
        assert "2 of the optimizer's 2 parameters" in msg and "torch.bfloat16" in msg
        assert "built before run.model" in msg and "Build the optimizer after run.model" in msg


def test_optimizer_built_after_run_model_steps(new_params_on_cast: None) -> None:
    with ss.init(seed=0, precision="bf16-true") as run:
        model = run.model(nn.Linear(3, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = model.weight.detach().clone()
        run.backward(_loss(model))
        run.step(opt)
        assert not torch.equal(before, model.weight)


def test_optimizer_first_is_fine_where_parameters_are_kept() -> None:
    """Single process, fp32: run.model keeps the parameter objects, so the order is free."""
    with ss.init(seed=0) as run:
        net = nn.Linear(3, 2)
        extra = nn.Parameter(torch.zeros(()))  # a parameter of no model is not flagged
        opt = torch.optim.SGD([*net.parameters(), extra], lr=0.1)
        model = run.model(net)
        before = model.weight.detach().clone()
        run.backward(_loss(model) + extra)
        run.step(opt)
        assert not torch.equal(before, model.weight)


def test_a_checked_optimizer_is_a_dict_lookup_and_follows_observer_changes() -> None:
    from splitsync.observe import Observer

    class Counting(Observer):
        calls = 0

        def on_step_begin(self, optimizer: torch.optim.Optimizer) -> None:
            Counting.calls += 1

    with ss.init(seed=0, guards=False) as run:
        model = run.model(nn.Linear(3, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.backward(_loss(model))
        run.step(opt)
        assert run._training.steps == {opt: run._plan.step}  # the plain step, no wrapper
        obs = run.add_observer(Counting())
        run.backward(_loss(model))
        run.step(opt)
        assert Counting.calls == 1
        run.remove_observer(obs)
        assert run._training.steps[opt] is run._training.step


def test_ddp_options_are_ignored_when_auto_is_one_process() -> None:
    with ss.init(seed=0) as run:
        model = run.model(nn.Linear(3, 2), find_unused_parameters=True, static_graph=False,
                          bucket_cap_mb=10)
        assert isinstance(model, nn.Linear)
        with pytest.raises(TypeError, match="does not take"):
            run.model(nn.Linear(3, 2), blocks=None)  # not DDP's: still an error
    with ss.init(seed=0, strategy="single") as run:
        with pytest.raises(TypeError, match=r"strategy 'single' does not take"):
            run.model(nn.Linear(3, 2), find_unused_parameters=True)
