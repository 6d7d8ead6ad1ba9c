"""Data parallelism is the same maths: 2 ranks at batch b == 1 process at batch 2b."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import splitsync
from splitsync.testing import spawn

STEPS, B = 20, 4


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * 2 * B, 8, generator=g)
    y = torch.randint(0, 3, (STEPS * 2 * B,), generator=g)
    return TensorDataset(x, y)


def _net(batchnorm: bool) -> nn.Module:
    torch.manual_seed(0)
    mid: list[nn.Module] = [nn.BatchNorm1d(16)] if batchnorm else []
    return nn.Sequential(nn.Linear(8, 16), *mid, nn.ReLU(), nn.Linear(16, 3))


def _train(model: nn.Module, batches: object, backward: object, step: object) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:  # type: ignore[attr-defined]
        loss = nn.functional.cross_entropy(model(x), y)
        backward(loss)  # type: ignore[operator]
        step(opt)  # type: ignore[operator]


def _ranks(rank: int, world: int, batchnorm: bool, sync: bool) -> list[torch.Tensor]:
    with splitsync.init(seed=0) as run:
        model = run.model(_net(batchnorm), sync_batchnorm=sync)
        loader = run.loader(_data(), batch_size=B, shuffle=False)
        _train(model, loader, run.backward, run.step)
        return [p.detach().clone() for p in run.unwrap(model).state_dict().values()]


def _reference(batchnorm: bool) -> list[torch.Tensor]:
    x, y = _data().tensors
    model = _net(batchnorm)
    batches = [(x[i : i + 2 * B], y[i : i + 2 * B]) for i in range(0, len(x), 2 * B)]

    def step(opt: torch.optim.Optimizer) -> None:
        opt.step()
        opt.zero_grad()

    _train(model, batches, lambda loss: loss.backward(), step)
    return [t.detach().clone() for t in model.state_dict().values()]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b, strict=True))


def test_two_ranks_equal_one_process_on_global_batch() -> None:
    out = spawn(_ranks, 2, False, False)
    assert _max_diff(out[0], out[1]) == 0.0
    assert _max_diff(out[0], _reference(False)) <= 1e-5


@pytest.mark.parametrize("sync", [False, True])
def test_batchnorm_needs_sync_batchnorm(sync: bool) -> None:
    out = spawn(_ranks, 2, True, sync)
    diff = _max_diff(out[0], _reference(True))
    if sync:
        assert diff <= 1e-5
    else:
        assert diff > 1e-3  # per-rank statistics differ from the global batch's
