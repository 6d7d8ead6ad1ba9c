"""Precision policies, accumulation and clipping in one process (no group)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.run.step import StepPlan
from splitsync.train.precision import Precision, get_precision


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def test_bad_names_and_values_name_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"bf16-mixed.*16-mixed.*bf16-true"):
        ss.init(precision="fp16")
    with pytest.raises(ValueError, match=r"single.*ddp.*fsdp.*dp"):
        ss.init(strategy="deepspeed")
    with pytest.raises(ValueError, match=r"bf16-mixed.*'32'"):
        ss.init(precision="16-mixed", device="cpu")
    with pytest.raises(ValueError, match="integer >= 1"):
        ss.init(accumulate=0)
    with ss.init(seed=0) as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.backward(model(torch.randn(2, 5)).sum())
        for bad in (0, -1.0, float("nan"), "big"):
            with pytest.raises(ValueError, match=r"clip=.*> 0"):
                run.step(opt, clip=bad)


def test_precision_32_adds_nothing_to_the_hot_path() -> None:
    with ss.init(seed=0, guards=False) as run:
        model = run.model(_net())
        assert "forward" not in vars(model)  # forward untouched: no wrapper, no autocast
    with ss.init(seed=0) as run:
        model = run.model(_net())
        # with guards on (the default) only the device-mismatch guard wraps forward
        assert type(vars(model)["forward"]).__name__ == "GuardedForward"
        assert vars(model)["forward"].inner.__func__ is type(model).forward  # no autocast
        assert run._plan.backward.__name__ == "_plain_backward"
        assert run._plan.step.__name__ == "_step_plain"


def test_bf16_mixed_autocasts_forward_and_context() -> None:
    with ss.init(seed=0, precision="bf16-mixed") as run:
        model = run.model(_net())
        out = model(torch.randn(4, 5))
        assert out.dtype == torch.bfloat16
        assert next(model.parameters()).dtype == torch.float32
        with run.autocast():
            assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16
        assert run.unwrap(model).state_dict().keys() == _net().state_dict().keys()
        plain = run.model(_net(), autocast=False)
        assert plain(torch.randn(4, 5)).dtype == torch.float32


def test_bf16_true_casts_parameters_and_inputs() -> None:
    with ss.init(seed=0, precision="bf16-true") as run:
        model = run.model(_net())
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        out = model(torch.randn(4, 5))  # fp32 input is cast, not a dtype error
        assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("k", [2, 4])
def test_accumulation_equals_one_step_on_the_concatenated_batch(k: int) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4 * k, 5, generator=g), torch.randn(4 * k, 3, generator=g)
    with ss.init(seed=0, accumulate=k) as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        results = []
        for xb, yb in zip(x.chunk(k), y.chunk(k), strict=True):
            run.backward(nn.functional.mse_loss(model(xb), yb))
            results.append(run.step(opt, clip=100.0))
    # run.step says whether it stepped; the norm comes only with the step that reached clip
    assert [r.stepped for r in results] == [False] * (k - 1) + [True]
    assert [r.norm is None for r in results] == [True] * (k - 1) + [False]
    assert [bool(r) for r in results] == [r.stepped for r in results]
    ref = _net()
    nn.functional.mse_loss(ref(x), y).backward()
    torch.optim.SGD(ref.parameters(), lr=0.5).step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_clip_returns_norm_before_clipping_and_clips() -> None:
    with ss.init(seed=0) as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        run.backward(model(torch.randn(8, 5) * 10).pow(2).sum())
        expected = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))
        grads = [p.grad for p in model.parameters()]
        result = run.step(opt, clip=1.0)
        assert result.stepped and float(result) == float(result.norm)  # float(): the norm
        norm = result.norm
        assert float(norm) == pytest.approx(float(expected), rel=1e-6)
        after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        assert float(after) == pytest.approx(1.0, rel=1e-4)


def test_scaler_skips_inf_steps_and_unscales_before_clipping() -> None:
    # The "16-mixed" step logic with a CPU GradScaler (fp16 autocast itself needs a GPU).
    policy = Precision("16-mixed", "cpu", None, None, True)
    plan = StepPlan(policy, accumulate=1)
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scale0 = plan.scaler.get_scale()
    plan.backward(model(torch.randn(3, 5)).sum())
    next(model.parameters()).grad[0, 0] = float("inf")
    skipped = plan.step(opt)  # a step the scaler skipped did not step: distinct from ...
    assert not skipped.stepped and skipped.norm is None
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    plan.backward(model(torch.randn(3, 5)).sum())  # deferred update lowers the scale
    assert plan.scaler.get_scale() < scale0
    norm = plan.step(opt, clip=1e9)
    assert 0 < float(norm) < 1e3  # unscaled: the true gradient norm, far below the loss scale
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    plan.backward(model(torch.randn(3, 5)).sum())
    plain = plan.step(opt)  # ... a step without clip, which stepped and has no norm
    assert plain.stepped and plain.norm is None


def test_step_result_says_stepped_apart_from_the_norm() -> None:
    from splitsync.run.step import NOT_STEPPED, STEPPED, StepResult

    with ss.init(seed=0) as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.backward(model(torch.randn(3, 5)).sum())
        result = run.step(opt)
    assert result is STEPPED and result.stepped and result and result.norm is None
    assert not NOT_STEPPED and not NOT_STEPPED.stepped
    with pytest.raises(TypeError, match="give run.step\\(opt, clip=...\\)"):
        float(result)
    with pytest.raises(TypeError, match="did not step"):
        float(NOT_STEPPED)
    assert float(StepResult(True, torch.tensor(2.5))) == 2.5
    with pytest.raises(AttributeError):
        result.stepped = False  # type: ignore[misc]  # frozen: the shared constants stay true


def test_get_precision_describes_each_policy() -> None:
    assert get_precision("32", "cpu").autocast_dtype is None
    assert get_precision("bf16-mixed", "cpu").autocast_dtype == torch.bfloat16
    assert get_precision("bf16-true", "cpu").param_dtype == torch.bfloat16
    p16 = get_precision("16-mixed", "cuda")
    assert p16.scaled and p16.autocast_dtype == torch.float16
