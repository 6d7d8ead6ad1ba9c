"""Gradient clipping by global norm, correct for replicated (DDP) and sharded (FSDP2) gradients."""

from __future__ import annotations

import math
from collections.abc import Iterable

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
    the same, global norm.
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.zeros(())
    grads = [p.grad for p in params]
    total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite=False)
    full = getattr(total, "full_tensor", None)  # DTensor (FSDP2): reduce across shards
    if full is not None:
        total = full()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_optimizer(optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """:func:`clip_grad_norm` over every parameter the optimizer updates."""
    max_norm = check_clip(max_norm)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return clip_grad_norm(params, max_norm)
