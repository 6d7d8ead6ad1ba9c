"""Tensor parallelism on NCCL: TP 2 (and dp 2 x tp 2 on 4 GPUs) against one process, and the
TP strategy on one GPU. Skipped without CUDA (and without enough GPUs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from splitsync.testing import spawn

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
pytestmark = [pytest.mark.skipif(not CUDA, reason="needs CUDA"), pytest.mark.timeout(240)]

SEQ, VOCAB = 16, 64


def _model() -> nn.Module:
    sys.path.insert(0, EXAMPLES)
    from tp_transformer import Transformer

    torch.manual_seed(0)
    return Transformer(VOCAB, 64, 4, 2, SEQ)


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (8, SEQ + 1), generator=torch.Generator().manual_seed(1))


def _loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def _reference() -> torch.Tensor:
    torch.backends.cuda.matmul.allow_tf32 = False
    model = _model().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _loss(model, _tokens().cuda()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()


def tp_rank(rank: int, world: int, mesh: dict[str, int]) -> float:
    import splitsync as ss

    sys.path.insert(0, EXAMPLES)
    from tp_transformer import tp_plan

    torch.backends.cuda.matmul.allow_tf32 = False
    with ss.init(seed=0, mesh=mesh) as run:
        assert run.backend == "nccl" or world == 1
        model = run.model(_model(), tp_plan=tp_plan())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        per = 8 // run.dp_size
        tokens = _tokens()[run.dp_rank * per:(run.dp_rank + 1) * per].cuda()
        run.backward(_loss(model, tokens))
        run.step(opt, clip=0.5)
        got = torch.cat([(p.detach().full_tensor() if hasattr(p, "full_tensor")
                          else p.detach()).flatten() for p in model.parameters()]).cpu()
    return float((got - _reference()).abs().max())


def test_tp_strategy_on_one_gpu() -> None:
    assert tp_rank(0, 1, {"tp": 1}) < 1e-5


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
def test_tp_on_nccl_matches_single_process() -> None:
    for diff in spawn(tp_rank, 2, {"tp": 2}, timeout=200):
        assert diff < 1e-4  # another reduction order than one GPU's, in float32


@pytest.mark.skipif(GPUS < 4, reason="needs 4 CUDA GPUs")
def test_dp_and_tp_on_nccl_match_single_process() -> None:
    for diff in spawn(tp_rank, 4, {"dp_shard": 2, "tp": 2}, timeout=200):
        assert diff < 1e-4
