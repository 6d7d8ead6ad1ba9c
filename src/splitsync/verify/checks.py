"""The self-test's checks, one function each; each returns a :class:`Result`."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Result", "check_backend", "train_tiny", "roundtrip_checkpoint", "compare_params"]


@dataclass(frozen=True)
class Result:
    """One row of the pass/fail table."""

    check: str
    ok: bool
    detail: str


def check_backend(backend: str, rank: int, world: int) -> Result:
    """all_reduce, all_gather, broadcast and barrier on a new group of ``backend``."""
    name = f"collectives on {backend}"
    try:
        group = dist.new_group(backend=backend)
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
            else torch.device("cpu")
        t = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(t, group=group)
        expect = world * (world + 1) / 2
        parts = [torch.zeros(2, device=device) for _ in range(world)]
        dist.all_gather(parts, torch.full((2,), float(rank), device=device), group=group)
        b = torch.full((3,), float(rank + 7), device=device)
        dist.broadcast(b, src=0, group=group)
        dist.barrier(group=group)
        problems = []
        if not torch.all(t == expect):
            problems.append(f"all_reduce gave {t.tolist()}, expected {expect}")
        if [float(p[0]) for p in parts] != [float(r) for r in range(world)]:
            problems.append("all_gather returned ranks out of order")
        if not torch.all(b == 7.0):
            problems.append(f"broadcast gave {b.tolist()}")
        dist.destroy_process_group(group)
    except Exception as exc:  # report, never hide: the table shows the backend's own error
        return Result(name, False, f"{type(exc).__name__}: {str(exc).strip()[:300]}")
    if problems:
        return Result(name, False, "; ".join(problems))
    return Result(name, True, f"{world} ranks: all_reduce, all_gather, broadcast, barrier")


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def train_tiny(run: Any, global_batch: int = 16, epochs: int = 2) -> tuple[nn.Module, Any]:
    """Train a tiny regression net at global batch ``global_batch`` split over the ranks."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    data = torch.utils.data.TensorDataset(x, y)
    model = run.model(TinyNet())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = run.loader(data, batch_size=global_batch // run.world_size, shuffle=True)
    for _ in run.epochs(epochs):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            run.backward(loss)
            run.step(opt)
    return model, opt


def roundtrip_checkpoint(model: nn.Module, opt: torch.optim.Optimizer, path: Path) -> Result:
    """Save model and optimizer state, load it back with weights_only=True, compare."""
    from splitsync.strategies import unwrap

    state = {"model": unwrap(model).state_dict(), "optim": opt.state_dict()}
    try:
        torch.save(state, path)
        back = torch.load(path, weights_only=True)
        same = all(torch.equal(v, back["model"][k]) for k, v in state["model"].items())
        same = same and back["optim"]["param_groups"] == state["optim"]["param_groups"]
    except Exception as exc:
        return Result("checkpoint round trip", False, f"{type(exc).__name__}: {exc}")
    if not same:
        return Result("checkpoint round trip", False, "loaded state differs from saved state")
    return Result("checkpoint round trip", True, f"{len(state['model'])} tensors + optimizer")


def compare_params(one: dict[str, torch.Tensor], many: dict[str, torch.Tensor], n: int,
                   atol: float = 1e-5) -> Result:
    """1-process and N-process training must end at the same parameters."""
    name = f"train 1 vs {n} processes"
    if one.keys() != many.keys():
        return Result(name, False, "the two runs have different parameter names")
    worst = max(float((one[k] - many[k]).abs().max()) for k in one)
    if worst > atol:
        return Result(name, False, f"parameters differ by up to {worst:.2e} (> {atol:g}): "
                                   "data parallelism is not reproducing 1-process training")
    return Result(name, True, f"same parameters (max |diff| {worst:.1e})")


def temp_path(directory: Path, name: str) -> Path:
    """A file name in ``directory`` (created) for one rank's scratch data."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkstemp(prefix=name, dir=directory)[1])
