"""DDP communication hooks selectable by name: gradient compression for slow links."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = ["COMM_HOOKS", "register_comm_hook"]

COMM_HOOKS: tuple[str, ...] = ("allreduce", "bf16", "fp16", "powersgd")


def register_comm_hook(model: DistributedDataParallel, name: str,
                       options: Mapping[str, Any] | None = None) -> Any:
    """Register the hook called ``name`` on ``model``; return its state (None if stateless).

    "bf16"/"fp16" halve the all-reduced bytes by casting each bucket; "powersgd" sends a
    low-rank approximation (``options`` go to ``PowerSGDState``, e.g.
    ``matrix_approximation_rank``, ``start_powerSGD_iter``); "allreduce" is DDP's default.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    options = dict(options or {})
    if name not in COMM_HOOKS:
        raise ValueError(
            f"Unknown comm_hook {name!r}. Valid comm hooks: {', '.join(map(repr, COMM_HOOKS))}."
        )
    if name != "powersgd" and options:
        raise ValueError(
            f"comm_hook={name!r} takes no comm_hook_options (got {sorted(options)}); "
            "only 'powersgd' does."
        )
    if name == "bf16" and dist.get_backend() not in ("nccl", "xccl"):
        raise ValueError(
            f"comm_hook='bf16' needs the nccl (CUDA) or xccl (XPU) backend; this group uses "
            f"{dist.get_backend()!r}. Use comm_hook='fp16' or 'powersgd' here."
        )
    if name == "powersgd":
        try:
            state = powerSGD_hook.PowerSGDState(process_group=None, **options)
        except TypeError as exc:
            raise ValueError(f"comm_hook_options for 'powersgd': {exc}") from None
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    hook = {"allreduce": default_hooks.allreduce_hook,
            "bf16": default_hooks.bf16_compress_hook,
            "fp16": default_hooks.fp16_compress_hook}[name]
    model.register_comm_hook(None, hook)
    return None
