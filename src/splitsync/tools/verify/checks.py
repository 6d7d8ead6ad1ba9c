"""The self-test's checks, one function each; each returns a :class:`Result`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Result", "not_checkable", "check_backend", "train_tiny", "roundtrip_checkpoint",
           "compare_params"]


@dataclass(frozen=True)
class Result:
    """One row of the pass/fail table. ``checkable=False``: the check could not be made on
    this script (``detail`` says why); it never fails the verify."""

    check: str
    ok: bool
    detail: str
    checkable: bool = True


def not_checkable(check: str, reason: str) -> Result:
    """A row for a check this script gives verify no way to make."""
    return Result(check, True, reason, checkable=False)


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


def roundtrip_checkpoint(run: Any, model: nn.Module, opt: torch.optim.Optimizer,
                         directory: Path) -> Result:
    """run.save, wipe the weights, run.resume: the weights and optimizer state come back.

    Collective (every rank calls it); ``directory`` must be the same on all ranks.
    """
    name = "checkpoint round trip"
    try:
        run.resume(directory, model=model, optimizer=opt)  # registers; nothing to load yet
        weights = {k: v.detach().clone() for k, v in run.unwrap(model).state_dict().items()}
        run.save(directory)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        state = run.resume(directory, model=model, optimizer=opt)
        back = run.unwrap(model).state_dict()
        same = state.resumed and all(torch.equal(v, back[k]) for k, v in weights.items())
    except Exception as exc:
        return Result(name, False, f"{type(exc).__name__}: {exc}")
    if not same:
        return Result(name, False, "the resumed weights differ from the saved ones")
    return Result(name, True, f"{len(weights)} tensors + optimizer, atomic save and verified load")


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
