"""DistributedDataParallel with gradients as views into the all-reduce buckets."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from splitsync.strategies.base import Strategy, SyncSetter, WrapContext

if TYPE_CHECKING:
    from splitsync.strategies.count import CountSync

OPTIONS = ("find_unused_parameters", "static_graph", "bucket_cap_mb", "broadcast_buffers",
           "comm_hook", "comm_hook_options")


class DDP(Strategy):
    """One replica per process; gradients all-reduced in buckets during backward."""

    name = "ddp"
    options = OPTIONS
    joins_uneven = True

    def owns(self, model: nn.Module) -> bool:
        return isinstance(model, DistributedDataParallel)

    def wrap(self, module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
        if not dist.is_initialized():
            raise RuntimeError(
                "strategy='ddp' needs a process group. Launch with `splitsync run -n N "
                "script.py` (or torchrun), or use strategy='auto' to run unwrapped in one "
                "process."
            )
        device_ids = [ctx.device.index] if ctx.device.type in ("cuda", "xpu") else None
        kwargs = dict(options)
        hook = kwargs.pop("comm_hook", None)
        hook_options = kwargs.pop("comm_hook_options", None)
        # gradient_as_bucket_view: gradients alias the buckets, so no second copy is kept.
        model = DistributedDataParallel(
            module, device_ids=device_ids, gradient_as_bucket_view=True, **kwargs
        )
        if hook is not None:
            from splitsync.strategies.ddp_hooks import register_comm_hook

            register_comm_hook(model, hook, hook_options)
        elif hook_options:
            raise ValueError("comm_hook_options given without comm_hook; name the hook too.")
        return model

    def sync_setter(self, model: nn.Module) -> SyncSetter | None:
        if not isinstance(model, DistributedDataParallel):
            return None

        def set_ddp(flag: bool) -> None:
            # what DDP.no_sync() toggles; DDP reads it in forward
            model.require_backward_grad_sync = flag

        return set_ddp

    def no_sync(self, model: nn.Module) -> AbstractContextManager[None]:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return nullcontext()

    def count_sync(self, model: nn.Module) -> CountSync | None:
        # Only one comm hook per DDP model: with the user's (comm_hook="fp16", ...) the step
        # rescales instead. The hook writes into the buckets the gradients are views of. The
        # count rides in a bucket of the gradients' dtype: exact in float32 up to 2**24 items,
        # in bfloat16 ("bf16-true") only up to 256, so there the step rescales too.
        if (not isinstance(model, DistributedDataParallel) or getattr(model, "_comm_hooks", ())
                or not model.gradient_as_bucket_view or any(
                    p.dtype not in (torch.float32, torch.float64)
                    for p in model.parameters() if p.requires_grad)):
            return None
        from splitsync.strategies.count import DdpCount

        return DdpCount(model)

    def joinables(self, model: nn.Module) -> list[Any]:
        return [model] if isinstance(model, DistributedDataParallel) else []


STRATEGY = DDP()
