"""DistributedDataParallel with gradients as views into the all-reduce buckets, laid out
once before the first step so that a resumed run sums gradients as an uninterrupted one.

DDP all-reduces gradients in buckets. A new wrapper's first backward uses an initial layout
(every parameter in one bucket, in definition order); at its second forward DDP rebuilds the
buckets in the order the first backward produced gradients. Where an element sits in a
bucket decides the order in which gloo's (and NCCL's) ring algorithms add the ranks'
values, and at 3 or more ranks floating-point addition in another order gives other bits
(at 2 ranks it is a + b either way). So a run resumed at step k, whose new wrapper takes
step k+1 with the initial layout, ended 3e-8 away from the run that took step k+1 with the
rebuilt one. :func:`fix_bucket_layout` rebuilds the buckets when the wrapper is made, from
an order known beforehand (the reverse of the definition order, which is close to the order
backward produces gradients in, so all-reduces still overlap backward): every step of every
wrapper, fresh or resumed, uses the same layout.

When it is rebuilt matters too. A rebuild makes every gradient then present a view of its
bucket, and DDP divides a gradient that is a view in place (``grad /= world``) but one that
is not while copying it (``grad * (1 / world)``), which differ in the last bit at 3 ranks.
Rebuilt at the first forward, the buckets of a run resumed inside an accumulation window
would take in the window's restored gradients, which the uninterrupted run's never held.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from splitsync.strategies.base import Strategy, SyncSetter, WrapContext

if TYPE_CHECKING:
    from splitsync.strategies.count import CountSync

OPTIONS = ("find_unused_parameters", "static_graph", "bucket_cap_mb", "broadcast_buffers",
           "comm_hook", "comm_hook_options")


class DDP(Strategy):
    """One replica per process; gradients all-reduced in buckets during backward."""

    name = "ddp"
    options = OPTIONS

    def owns(self, model: nn.Module) -> bool:
        return isinstance(model, TorchDDP)

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
        fixed = ctx.world_size > 2 and not kwargs.get("find_unused_parameters", False)
        cls = DistributedDataParallel if fixed else TorchDDP
        model = cls(module, device_ids=device_ids, gradient_as_bucket_view=True, **kwargs)
        if fixed:
            fix_bucket_layout(model)
        if hook is not None:
            from splitsync.strategies.ddp_hooks import register_comm_hook

            register_comm_hook(model, hook, hook_options)
        elif hook_options:
            raise ValueError("comm_hook_options given without comm_hook; name the hook too.")
        return model

    def sync_setter(self, model: nn.Module) -> SyncSetter | None:
        if not isinstance(model, TorchDDP):
            return None

        def set_ddp(flag: bool) -> None:
            # what DDP.no_sync() toggles; DDP reads it in forward
            model.require_backward_grad_sync = flag

        return set_ddp

    def no_sync(self, model: nn.Module) -> AbstractContextManager[None]:
        if isinstance(model, TorchDDP):
            return model.no_sync()
        return nullcontext()

    def count_sync(self, model: nn.Module) -> CountSync | None:
        # Only one comm hook per DDP model: with the user's (comm_hook="fp16", ...) the step
        # rescales instead. The hook writes into the buckets the gradients are views of. The
        # count rides in a bucket of the gradients' dtype: exact in float32 up to 2**24 items,
        # in bfloat16 ("bf16-true") only up to 256, so there the step rescales too.
        if (not isinstance(model, TorchDDP) or getattr(model, "_comm_hooks", ())
                or not model.gradient_as_bucket_view or any(
                    p.dtype not in (torch.float32, torch.float64)
                    for p in model.parameters() if p.requires_grad)):
            return None
        from splitsync.strategies.count import DdpCount

        return DdpCount(model)

    def joinables(self, model: nn.Module) -> list[Any]:
        return [model] if isinstance(model, TorchDDP) else []


class DistributedDataParallel(TorchDDP):
    """torch's DistributedDataParallel (same name, same behaviour) handing its reducer the
    parameters in reverse definition order: a layout built in that order
    (:func:`fix_bucket_layout`) puts the last layers, whose gradients backward produces
    first, in the first bucket, and DDP all-reduces buckets in their order, so communication
    still starts early in backward."""

    def _build_params_for_reducer(self, *args: Any, **kwargs: Any) -> Any:
        built = super()._build_params_for_reducer(*args, **kwargs)
        if (isinstance(built, tuple) and len(built) == 2
                and all(isinstance(x, list) for x in built)
                and len(built[0]) == len(built[1])):
            params, sparse = built
            return params[::-1], sparse[::-1]
        return built  # a layout this version does not know: left as DDP builds it


def fix_bucket_layout(model: TorchDDP) -> None:
    """Rebuild ``model``'s buckets now (collective), in the reducer's parameter order,
    instead of after its first backward in the order gradients arrived: then the first step
    of a resumed run's new wrapper sums as every later step does. Now, before any gradient
    exists, and not at the first forward: a window's gradients restored by ``run.resume``
    stay out of the buckets, as the uninterrupted run's were (module doc). (With
    ``find_unused_parameters=True`` DDP never rebuilds, so nothing changes there.)"""
    reducer = model.reducer
    push = getattr(reducer, "_push_all_rebuilt_params", None)
    rebuild = getattr(reducer, "_rebuild_buckets", None)
    if push is None or rebuild is None:  # say so rather than lose exactness silently
        warnings.warn("this PyTorch's DDP reducer has no _push_all_rebuilt_params or "
                      "_rebuild_buckets: a run resumed at 3 or more ranks may differ from an "
                      "uninterrupted one in the last bits of its gradients", RuntimeWarning,
                      stacklevel=3)
        return
    push()
    if rebuild():  # what DDP's _pre_forward would do at the first forward; once only
        model._has_rebuilt_buckets = True


STRATEGY = DDP()
