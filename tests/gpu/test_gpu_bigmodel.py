"""GPU paths of models that outgrow one device: FSDP2 CPU offload, activation checkpointing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.testing import spawn

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.skipif(not CUDA, reason="needs CUDA"), pytest.mark.timeout(240)]

WIDTH = 512  # 4 blocks of 2 x 512 x 2048 fp32 weights: ~33 MB of parameters


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(4)))


def _train(run: ss.Run, model: nn.Module, steps: int = 3
           ) -> tuple[torch.Tensor, set[str], set[str]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(steps, 8, WIDTH, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grads: set[str] = set()
    for s in range(steps):
        out = model(x[s].to(run.device))
        assert out.device.type == "cuda"
        run.backward(out.pow(2).mean())
        if s == steps - 1:
            grads = {p.grad.device.type for p in model.parameters()}
        run.step(opt)
    states = {v.device.type for st in opt.state.values() for v in st.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0}
    params = torch.cat([p.detach().full_tensor().flatten().cpu() for p in model.parameters()])
    return params, grads, states


def offload_rank(rank: int, world: int) -> dict:
    out: dict = {}
    with ss.init(seed=0, strategy="fsdp") as run:
        base = torch.cuda.memory_allocated()
        model = run.model(_net(), offload=True, activation_checkpointing=True)
        out["param_devices"] = sorted({p.device.type for p in model.parameters()})
        out["gpu_bytes_after_wrap"] = torch.cuda.memory_allocated() - base
        out["params_bytes"] = sum(p.numel() * 4 for p in model.parameters())
        out["offload"], out["grad_devices"], out["state_devices"] = _train(run, model)
        plain = run.model(_net())
        out["plain"], _, out["plain_state_devices"] = _train(run, plain)
    return out


def test_fsdp_offload_keeps_state_on_the_host_and_trains_like_plain_fsdp() -> None:
    (res,) = spawn(offload_rank, 1, timeout=200)
    assert res["param_devices"] == ["cpu"]  # the shards live on the host
    assert res["gpu_bytes_after_wrap"] < res["params_bytes"] / 4  # nothing left behind
    assert res["grad_devices"] == {"cpu"} and res["state_devices"] == {"cpu"}
    assert res["plain_state_devices"] == {"cuda"}
    # the optimizer steps on the CPU there, on the GPU here: equal up to rounding
    assert (res["offload"] - res["plain"]).abs().max().item() < 1e-5


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_data_parallel_with_activation_checkpointing_trains_like_without() -> None:
    import warnings

    results = []
    for spec in (None, Block):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DataParallel's note recommending DDP
            with ss.init(seed=0, strategy="dp") as run:
                model = run.model(_net(), activation_checkpointing=spec)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
                g = torch.Generator().manual_seed(1)
                for _ in range(3):
                    run.backward(model(torch.randn(8, WIDTH, generator=g).cuda()).pow(2).mean())
                    run.step(opt)
                results.append(torch.cat([p.detach().flatten().cpu()
                                          for p in model.parameters()]))
    assert (results[0] - results[1]).abs().max().item() <= 1e-6
