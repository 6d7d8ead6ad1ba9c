"""``run.backward(loss, count=n)`` on CUDA: bf16-mixed with accumulation and empty
micro-batches, and the DDP and FSDP2 reductions over NCCL (their count stays on the device).
Skipped without CUDA; the two-rank test needs two GPUs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import splitsync as ss

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
pytestmark = [pytest.mark.skipif(not CUDA, reason="needs CUDA"), pytest.mark.timeout(240)]

VOCAB, SEQ = 32, 16
LENGTHS = ((16, 3, 0, 0, 9, 12, 1, 5), (0, 0, 0, 0, 7, 7, 2, 16), (4, 0, 11, 2, 0, 0, 8, 1))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, 64), nn.GELU(),
                         nn.Linear(64, VOCAB))


def _batch(step: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, VOCAB, (8, SEQ + 1), generator=g)
    mask = (torch.arange(SEQ)[None] < torch.tensor(LENGTHS[step])[:, None]).float()
    return tokens.to(device), mask.to(device)


def _loss(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1]).float()
    per_token = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return (per_token * mask).sum() / mask.sum()  # 0/0 without a real token


def _flat(model: nn.Module) -> torch.Tensor:
    parts = []
    for p in model.parameters():
        whole = getattr(p, "full_tensor", None)
        parts.append((whole() if whole is not None else p).detach().double().flatten().cpu())
    return torch.cat(parts)


def _reference() -> torch.Tensor:
    """One process in float64 on the whole batch: the mean over all real tokens."""
    model = _net().double()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for s in range(len(LENGTHS)):
        tokens, mask = _batch(s, "cpu")
        _loss(model, tokens, mask.double()).backward()
        opt.step()
        opt.zero_grad()
    return _flat(model)


def _train(run: ss.Run, model: nn.Module, micro: int) -> torch.Tensor:
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    size = 8 // run.world_size // micro
    for s in range(len(LENGTHS)):
        tokens, mask = _batch(s, run.device)
        for m in range(micro):
            at = (m * run.world_size + run.rank) * size
            real = mask[at:at + size]
            run.backward(_loss(model, tokens[at:at + size], real), count=real.sum())
            run.step(opt)
    return _flat(model)


def _close_to_reference(weights: torch.Tensor, ref: torch.Tensor) -> float:
    return ((weights - ref).norm() / (ref - _flat(_net())).norm()).item()


def test_bf16_mixed_with_accumulation_and_empty_micro_batches_on_cuda() -> None:
    with ss.init(seed=0, device="cuda", precision="bf16-mixed", accumulate=4) as run:
        weights = _train(run, run.model(_net()), 4)
    assert torch.isfinite(weights).all()
    assert _close_to_reference(weights, _reference()) <= 0.15  # bf16 noise (~0.05 on CPU)


def _one_rank_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    from splitsync.distributed.group import free_port

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_reductions_divide_by_the_count_over_nccl(strategy: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each strategy's count reduction on a 1-rank NCCL group: the gradient after the
    window's backward is the local one divided by unit * count, and the count stays on the
    device until the step reads it."""
    from splitsync.strategies import get_strategy

    _one_rank_nccl(monkeypatch)
    plain = _net().cuda()
    tokens, mask = _batch(0, "cuda")
    _loss(plain, tokens, mask).backward()  # the gradient of the mean, unscaled
    with ss.init(seed=0, strategy=strategy) as run:
        assert run.backend == "nccl"
        model = run.model(_net())
        sync = get_strategy(strategy).count_sync(model)
        assert sync is not None
        n, unit = float(mask.sum()), 0.25
        sync.before(n, unit)
        (_loss(model, tokens, mask) * (n * unit)).backward()
        total = sync.after(lambda: n)
        if strategy == "ddp":  # carried by the all-reduce, left on the device
            assert isinstance(total, torch.Tensor) and total.is_cuda and float(total) == n
        for p, q in zip(model.parameters(), plain.parameters(), strict=True):
            grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            assert torch.allclose(grad, q.grad, rtol=1e-5, atol=1e-7)


def _two_ranks(rank: int, world: int) -> list[float]:
    with ss.init(seed=0, precision="bf16-mixed", accumulate=2) as run:
        assert run.backend == "nccl"
        return _train(run, run.model(_net()), 2).tolist()


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_two_nccl_ranks_train_like_one_process_on_the_global_batch() -> None:
    from splitsync.testing import spawn

    out = spawn(_two_ranks, 2, timeout=200)
    weights = torch.tensor(out[0], dtype=torch.float64)
    assert torch.isfinite(weights).all() and out[0] == out[1]
    assert _close_to_reference(weights, _reference()) <= 0.15
