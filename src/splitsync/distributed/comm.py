"""Collectives that accept tensors or Python numbers and are no-ops at world size 1."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = ["is_active", "reduce", "all_gather", "broadcast_object", "barrier", "gather_object",
           "gather_object_to"]

Number = int | float | bool
T = TypeVar("T")
_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


def is_active() -> bool:
    """True when a process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _as_tensor(x: torch.Tensor | Number, device: torch.device) -> tuple[torch.Tensor, bool]:
    if isinstance(x, torch.Tensor):
        return x.detach().clone().to(device), False
    return torch.tensor(float(x), dtype=torch.float64, device=device), True


def reduce(x: torch.Tensor | Number, op: str, device: torch.device) -> torch.Tensor | float:
    """All-reduce ``x`` with op sum, mean, max or min; returns the same kind it was given."""
    if op not in _OPS:
        raise ValueError(f"op={op!r} is not one of {sorted(_OPS)}")
    if not is_active():
        if isinstance(x, torch.Tensor):
            return x.detach()
        return float(x)
    t, was_number = _as_tensor(x, device)
    if op == "mean" and not t.is_floating_point():
        t = t.double()
    dist.all_reduce(t, op=getattr(dist.ReduceOp, _OPS[op]))
    if op == "mean":
        t = t / dist.get_world_size()
    return float(t.item()) if was_number else t


def all_gather(x: torch.Tensor | Number, device: torch.device) -> torch.Tensor:
    """Concatenate ``x`` from all ranks along dim 0, ranks in order.

    Tensors may differ in their first dimension between ranks (padded internally).
    """
    t, _ = _as_tensor(x, device)
    if t.dim() == 0:
        t = t.reshape(1)
    if not is_active():
        return t
    world = dist.get_world_size()
    size = torch.tensor([t.shape[0]], device=device, dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    lengths = [int(s.item()) for s in sizes]
    longest = max(lengths)
    if t.shape[0] < longest:
        pad = t.new_zeros((longest - t.shape[0], *t.shape[1:]))
        t = torch.cat([t, pad])
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat([p[:n] for p, n in zip(parts, lengths, strict=True)])


def broadcast_object(obj: T, src: int = 0, group: Any = None) -> T:
    """Send a picklable object from ``src`` to every rank (trusted, in-job data only), on
    ``group`` (default: the training group; it must span every rank)."""
    if not is_active():
        return obj
    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def gather_object_to(obj: T, dst: int = 0, group: Any = None) -> list[T]:
    """Every rank's ``obj``, in rank order, on rank ``dst`` (an empty list elsewhere), on
    ``group`` (default: the training group; it must span every rank)."""
    if not is_active():
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == dst else None
    dist.gather_object(obj, out, dst=dst, group=group)
    return out or []


def gather_object(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not is_active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank (no-op at world size 1)."""
    if is_active():
        dist.barrier()
