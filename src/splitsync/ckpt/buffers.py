"""Each rank's own buffers in its rank file: BatchNorm statistics differ by rank."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from splitsync.strategies.modules import unwrap

__all__ = ["rank_buffers", "restore_rank_buffers"]


def rank_buffers(models: Mapping[str, nn.Module]) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's persistent floating-point buffers of each model, host copies by the
    user's names. BatchNorm's running statistics differ by rank (under DDP each rank's
    forward updates its own after DDP's broadcast; an EMA averages each rank's), so every
    rank keeps its own in its rank file and a resume gives each rank back its own."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, model in models.items():
        own = {}
        for prefix, mod in unwrap(model).named_modules():
            for key, buf in mod.named_buffers(recurse=False):
                if buf is None or not buf.is_floating_point() or \
                        key in mod._non_persistent_buffers_set:
                    continue
                local = getattr(buf, "to_local", None)
                t = local() if local is not None else buf
                own[f"{prefix}.{key}" if prefix else key] = t.detach().to("cpu", copy=True)
        if own:
            out[name] = own
    return out


@torch.no_grad()
def restore_rank_buffers(models: Mapping[str, nn.Module],
                         saved: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """Inverse of :func:`rank_buffers`, for the models and buffers both sides have."""
    for name, model in models.items():
        mine = saved.get(name)
        if not mine:
            continue
        for key, buf in unwrap(model).named_buffers():
            t = mine.get(key)
            if t is None or not buf.is_floating_point():
                continue
            local = getattr(buf, "to_local", None)
            target = local() if local is not None else buf
            if target.shape == t.shape:
                target.copy_(t)
