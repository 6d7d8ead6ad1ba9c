"""FSDP block choice, DataParallel fallback and checks, comm-hook names (no group needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.strategies.ddp_hooks import register_comm_hook
from splitsync.strategies.dp import DataParallelWarning, check_batch
from splitsync.strategies.fsdp import _blocks, default_blocks


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 4)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 4)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.ln_a, self.ln_b = nn.LayerNorm(4), nn.LayerNorm(4)


def test_default_blocks_pick_repeated_composite_type() -> None:
    model = Tiny()
    assert default_blocks(model) == list(model.blocks)
    mlp = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert default_blocks(mlp) == [mlp[0], mlp[2]]
    assert default_blocks(nn.Linear(2, 2)) == []


def test_given_blocks_are_checked() -> None:
    model = Tiny()
    assert _blocks(model, [Block]) == list(model.blocks)
    assert _blocks(model, [model.embed]) == [model.embed]
    with pytest.raises(ValueError, match="no submodule of type"):
        _blocks(model, [nn.Conv2d])
    with pytest.raises(ValueError, match="not submodules"):
        _blocks(model, [nn.Linear(1, 1)])
    with pytest.raises(TypeError, match="module types"):
        _blocks(model, ["blocks"])


def test_fsdp_without_group_runs_unsharded_with_a_note(capsys: pytest.CaptureFixture) -> None:
    with ss.init(seed=0, strategy="fsdp") as run:
        model = run.model(Tiny().embed)
        assert isinstance(model, nn.Linear)
    assert "unsharded" in capsys.readouterr().err


def test_dp_falls_back_to_one_device_with_a_warning() -> None:
    with ss.init(seed=0, strategy="dp", device="cpu") as run:
        with pytest.warns(DataParallelWarning, match="Falling back to a single device"):
            model = run.model(nn.Linear(3, 2))
        assert isinstance(model, nn.Linear)
        assert run.unwrap(model) is model
        model(torch.randn(2, 3))


def test_dp_batch_checks_name_the_problem() -> None:
    with pytest.raises(ValueError, match="without a batch dimension"):
        check_batch((torch.tensor(1.0),), 2)
    with pytest.raises(ValueError, match=r"batch size 1 .* over 2 GPUs"):
        check_batch(({"x": torch.zeros(1, 3)},), 2)
    check_batch((torch.zeros(2, 3), 5, "text"), 2)


def test_unknown_comm_hook_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'allreduce', 'bf16', 'fp16', 'powersgd'"):
        register_comm_hook(None, "gzip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only 'powersgd'"):
        register_comm_hook(None, "fp16", {"matrix_approximation_rank": 2})  # type: ignore[arg-type]


def test_compile_with_dp_is_refused_and_single_compiles() -> None:
    from splitsync.strategies import get_strategy

    with pytest.raises(ValueError, match="strategy='ddp'"):
        get_strategy("dp").compile(nn.Linear(2, 2), {})
    with ss.init(seed=0) as run:
        model = run.model(nn.Linear(3, 2), compile={"backend": "eager"})
        assert model._compiled_call_impl is not None
        assert model(torch.randn(2, 3)).shape == (2, 2)
