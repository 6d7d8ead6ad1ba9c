"""GPU-only training paths: fp16 with GradScaler, DataParallel, NCCL bf16 hook, FSDP2 on NCCL."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from splitsync.testing import spawn

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
pytestmark = [pytest.mark.skipif(not CUDA, reason="needs CUDA"), pytest.mark.timeout(240)]
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), Block(), Block(), nn.Linear(16, 2))


def test_fp16_mixed_scales_and_skips_nonfinite_steps() -> None:
    import splitsync as ss

    with ss.init(seed=0, precision="16-mixed", device="cuda") as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 8, device="cuda"), torch.randn(8, 2, device="cuda")
        out = model(x)
        assert out.dtype == torch.float16
        run.backward(nn.functional.mse_loss(out.float(), y))
        assert run.scaler is not None
        before = [p.detach().clone() for p in model.parameters()]
        next(model.parameters()).grad.fill_(float("inf"))
        run.step(opt)  # skipped: gradients not finite
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
        scale = run.scaler.get_scale()
        run.backward(nn.functional.mse_loss(model(x).float(), y))
        assert run.scaler.get_scale() < scale
        norm = run.step(opt, clip=1.0).norm
        assert torch.isfinite(norm) and float(norm) < 1e3  # unscaled before clipping
        assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def fsdp_fp16_rank(rank: int, world: int) -> float:
    import splitsync as ss

    with ss.init(seed=0, strategy="fsdp", precision="16-mixed") as run:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = torch.randn(8, 8, device=run.device), torch.randn(8, 2, device=run.device)
        for _ in range(3):
            run.backward(nn.functional.mse_loss(model(x).float(), y))
            norm = run.step(opt, clip=1.0)
        assert type(run.scaler).__name__ == "ShardedGradScaler"
        return float(norm)


def test_fsdp_fp16_with_sharded_scaler_one_rank() -> None:
    (norm,) = spawn(fsdp_fp16_rank, 1, timeout=200)
    assert norm > 0


@two_gpus
def test_data_parallel_on_all_gpus() -> None:
    import splitsync as ss
    from splitsync.strategies.dp import CheckedDataParallel, DataParallelWarning

    with ss.init(seed=0, strategy="dp") as run:
        with pytest.warns(DataParallelWarning, match="DDP"):
            model = run.model(_net())
        assert isinstance(model, CheckedDataParallel)
        assert run.unwrap(model).state_dict().keys() == _net().state_dict().keys()
        out = model(torch.randn(2 * GPUS, 8, device="cuda"))
        assert out.shape == (2 * GPUS, 2)
        with pytest.raises(ValueError, match="batch size 1"):
            model(torch.randn(1, 8, device="cuda"))


def nccl_rank(rank: int, world: int) -> dict:
    import splitsync as ss

    out = {}
    with ss.init(seed=0) as run:
        model = run.model(_net(), comm_hook="bf16")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 8, device=run.device), torch.randn(8, 2, device=run.device)
        for _ in range(3):
            run.backward(nn.functional.mse_loss(model(x), y))
            run.step(opt)
        out["ddp"] = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().tolist()
    return out


@two_gpus
def test_bf16_compress_hook_on_nccl_keeps_ranks_identical() -> None:
    r0, r1 = spawn(nccl_rank, 2, timeout=200)
    assert r0["ddp"] == r1["ddp"]


def fsdp_match_rank(rank: int, world: int) -> float:
    import splitsync as ss

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)
    with ss.init(seed=0, strategy="fsdp") as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        part = slice(rank * 8, (rank + 1) * 8)
        run.backward(nn.functional.mse_loss(model(x[part].cuda()), y[part].cuda()))
        run.step(opt)
        params = torch.cat([p.detach().full_tensor().flatten() for p in model.parameters()])
    ref = _net()
    nn.functional.mse_loss(ref(x), y).backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    return (params.cpu() - torch.cat([p.detach().flatten() for p in ref.parameters()])).abs().max().item()


@two_gpus
def test_fsdp_on_nccl_matches_single_process() -> None:
    for diff in spawn(fsdp_match_rank, 2, timeout=200):
        assert diff < 1e-4  # TF32 matmuls may differ slightly from the CPU reference
