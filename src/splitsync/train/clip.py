"""Gradient clipping by global norm, correct for replicated (DDP) and sharded (FSDP2) gradients."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["check_clip", "clip_grad_norm", "clip_optimizer"]


def check_clip(max_norm: float) -> float:
    """``max_norm`` as a float; a clear error unless it is a finite number > 0."""
    try:
        value = float(max_norm)
    except (TypeError, ValueError):
        value = math.nan
    if not (value > 0 and math.isfinite(value)) or isinstance(max_norm, bool):
        raise ValueError(
            f"clip={max_norm!r}: give the maximum global gradient norm as a finite number > 0 "
            "(e.g. run.step(opt, clip=1.0)), or leave clip=None for no clipping."
        )
    return value


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float,
                   norm_type: float = 2.0) -> torch.Tensor:
    """Scale gradients so their global norm is at most ``max_norm``; return the norm before.

    Under DDP every rank holds the same all-reduced gradients, so the local norm is the
    global one. Under FSDP2 gradients are DTensor shards: the norm computed over them is a
    partial DTensor and ``full_tensor()`` reduces it across ranks, so every rank clips with
    the same, global norm. Under tensor parallelism the gradients live on several meshes;
    each mesh's norm is reduced on its own and the norms combine.
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.zeros(())
    grads = [p.grad for p in params]
    total = _global_norm(grads, norm_type)
    if len({getattr(g, "device_mesh", None) for g in grads}) == 1:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total
    # several meshes: no foreach op takes DTensors of different meshes together; the
    # scale is one number, so each rank scales its local pieces (torch's own formula)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    torch._foreach_mul_(local, coef.to(local[0].device))
    return total


def _global_norm(grads: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The norm of all ``grads`` together. Gradients on different meshes (tensor-parallel
    DTensors on a (dp, tp) mesh next to FSDP2 shards on the dp mesh alone, or plain
    replicated tensors) cannot be stacked into one norm: each mesh's norm is reduced over
    its ranks on its own, then the norms combine (a plain tensor's is whole already)."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault(getattr(g, "device_mesh", None), []).append(g)
    norms = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type, error_if_nonfinite=False)
        full = getattr(norm, "full_tensor", None)  # DTensor: reduce across its shards
        norms.append(full() if full is not None else norm)
    if len(norms) == 1:
        return norms[0]
    device = norms[0].device
    stacked = torch.stack([n.to(device) for n in norms])
    if math.isinf(norm_type):
        return stacked.max()
    return torch.linalg.vector_norm(stacked, norm_type)


def clip_optimizer(optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """:func:`clip_grad_norm` over every parameter the optimizer updates."""
    max_norm = check_clip(max_norm)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return clip_grad_norm(params, max_norm)
