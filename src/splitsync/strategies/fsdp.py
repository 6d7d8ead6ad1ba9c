"""FSDP2: ``fully_shard`` on each repeated block, then on the root.

Parameters, gradients and optimizer state are sharded across ranks; each block's
parameters are all-gathered just before its forward/backward and freed after. The
mixed-precision policy follows the run's precision; ``offload=True`` keeps the shards,
their gradients and the optimizer state on the host (``CPUOffloadPolicy``). State is read
and written through ``torch.distributed.checkpoint.state_dict`` (sharded, or gathered
whole). HSDP (``strategies/hsdp.py``) is this strategy over a 2-D mesh.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from splitsync.strategies import state as _state
from splitsync.strategies.base import Strategy, SyncSetter, WrapContext, meta_copy
from splitsync.strategies.blocks import default_blocks, given_blocks

if TYPE_CHECKING:
    from splitsync.strategies.count import CountSync
    from splitsync.train.precision import Precision

OPTIONS = ("blocks", "reshard_after_forward", "offload")

__all__ = ["FSDP", "STRATEGY", "OPTIONS", "sharded_units", "mixed_precision_policy", "offload_policy",
           "compile_blocks", "default_blocks"]

_log = logging.getLogger("splitsync")


def mixed_precision_policy(precision: Precision | None) -> Any:
    """FSDP2 policy for a precision: its autocast dtype for compute, fp32 gradient reduction.

    "32" and "bf16-true" (whose parameters already are bf16) get the default policy.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = None if precision is None else precision.autocast_dtype
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def compile_blocks(model: nn.Module, kwargs: Mapping[str, Any]) -> int:
    """Compile the forward of each sharded block (the root too if it has no blocks).

    Only the block's own forward is compiled: FSDP2's unshard/reshard hooks stay eager
    around it, as in the usual per-block recipe. Returns the number compiled.
    """
    from torch.distributed.fsdp import FSDPModule

    subs = [m for m in model.modules() if m is not model and isinstance(m, FSDPModule)]
    targets: Iterable[nn.Module] = subs or [model]
    n = 0
    for m in targets:
        m.forward = torch.compile(m.forward, **kwargs)
        n += 1
    return n


def check_offload(offload: Any, name: str = "fsdp") -> bool:
    """``offload=`` checked: a bool."""
    if not isinstance(offload, bool):
        raise TypeError(f"strategy={name!r} offload={offload!r}: give True (keep parameters, "
                        "gradients and optimizer state on the host) or False.")
    return offload


def offload_policy(offload: Any, device: torch.device, name: str = "fsdp", rank: int = 0) -> Any:
    """FSDP2's offload policy for ``offload=`` on ``device`` (the run's device); ``rank``
    0 says so when there is nothing to offload."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not check_offload(offload, name):
        return OffloadPolicy()
    if device.type == "cpu":
        # Still applied, so that a CPU run takes the same path as a GPU run; it copies nothing.
        if rank == 0:
            _log.info("offload=True: the device is the CPU already, so there is nothing to "
                      "offload; the shards stay where they are and training is unchanged.")
        return CPUOffloadPolicy(pin_memory=False)
    # Pinned host memory makes the host<->device copies asynchronous (CUDA only).
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")


def _blocks(module: nn.Module, given: Any, name: str = "fsdp") -> list[nn.Module]:
    return given_blocks(module, given, f"{name} blocks")


def shard(module: nn.Module, ctx: WrapContext, options: Mapping[str, Any], mesh: Any,
          name: str = "fsdp") -> nn.Module:
    """``fully_shard`` each block, then the root, over ``mesh`` (1-D: FSDP, 2-D: HSDP)."""
    from torch.distributed.fsdp import fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mixed_precision_policy(ctx.precision),
                              "offload_policy": offload_policy(options.get("offload", False),
                                                               ctx.device, name, ctx.rank)}
    if "reshard_after_forward" in options:
        kwargs["reshard_after_forward"] = options["reshard_after_forward"]
    for block in _blocks(module, options.get("blocks"), name):
        fully_shard(block, **kwargs)
    return fully_shard(module, **kwargs)


def unsharded(module: nn.Module, ctx: WrapContext, options: Mapping[str, Any],
              name: str = "fsdp") -> nn.Module:
    """The module as it is when there is no process group: one process, no sharding."""
    check_offload(options.get("offload", False), name)
    if ctx.world_size != 1:
        raise RuntimeError(
            f"strategy={name!r} needs a process group. Launch with `splitsync run -n N "
            "script.py` (or torchrun)."
        )
    # One process holds everything anyway; sharding over one rank would only add the
    # DTensor machinery. Say so rather than pretend, and name the options left unused.
    unused = sorted(k for k in ("offload", "replicate", "shard") if options.get(k))
    note = f" ({', '.join(unused)} not applied)" if unused else ""
    _log.warning(f"strategy={name!r} in a single process without a process group: the model "
                 f"runs unsharded{note}. Launch with `splitsync run -n N` to shard.")
    return module.to(ctx.device)


def _wrap(module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
    if not dist.is_initialized():
        return unsharded(module, ctx, options)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(ctx.device.type, (dist.get_world_size(),))
    return shard(module, ctx, options, mesh)


def shard_like(model: nn.Module, shadow: nn.Module) -> nn.Module:
    """``shadow`` (wrapped on meta the way ``model`` was) given storage on the model's
    device and the model's values, shard by shard: no communication, no full copy."""
    from torch.distributed.tensor import DTensor

    params = dict(model.named_parameters())
    first = next(iter(params.values()), None)
    local = first.to_local() if isinstance(first, DTensor) else first
    shadow.to_empty(device=local.device if local is not None else torch.device("cpu"))
    theirs = [*shadow.named_parameters(), *shadow.named_buffers()]
    mine = [*params.items(), *model.named_buffers()]
    if [n for n, _ in theirs] != [n for n, _ in mine]:
        raise RuntimeError("the copy of the FSDP model does not have the model's parameters "
                           f"({len(theirs)} vs {len(mine)} tensors); was it changed after "
                           "run.model?")
    with torch.no_grad():
        for (_, dst), (_, src) in zip(theirs, mine, strict=True):
            d = dst.to_local() if isinstance(dst, DTensor) else dst
            d.copy_(src.to_local() if isinstance(src, DTensor) else src)
    # FSDP2 keeps the root's parameters gathered after forward, for the backward that a
    # copy never runs: reshard, so the next forward gathers the values updated since.
    if hasattr(shadow, "reshard"):  # (a tensor-parallel copy without FSDP gathers nothing)
        shadow.register_forward_hook(_reshard)
    return shadow.requires_grad_(False)


def _reshard(module: nn.Module, args: Any, output: Any) -> None:
    module.reshard()


def _fsdp_params(model: nn.Module) -> dict[str, Any]:
    """FSDP2's per-parameter records of ``model``, by the user's parameter names."""
    from torch.distributed.fsdp import FSDPModule

    names = {m: prefix for prefix, m in model.named_modules()}
    out = {}
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        for fp in group.fsdp_params if group is not None else ():
            info = fp._module_info
            prefix = names[info.module]
            out[f"{prefix}.{info.param_name}" if prefix else info.param_name] = fp
    return out


def sharded_units(model: nn.Module) -> list[nn.Module]:
    """The FSDP2 units in ``model`` (itself included), outermost first: what a caller hooks
    per unit (e.g. fault tolerance's all-reduce across replica groups)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class FSDP(Strategy):
    """FSDP2: parameters become DTensor shards, so state is sharded and goes through DCP."""

    name = "fsdp"
    options = OPTIONS
    replaces_parameters = True

    def owns(self, model: nn.Module) -> bool:
        return _is_fsdp(model)

    def places(self, options: Mapping[str, Any]) -> bool:
        # With offload, fully_shard moves one block at a time to the device and its shard
        # back to the host: moving the whole model first could not fit where offload is needed.
        return options.get("offload") is True

    def blocks(self, module: nn.Module, options: Mapping[str, Any]) -> list[nn.Module]:
        return _blocks(module, options.get("blocks"), self.name)

    def wrap(self, module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
        return _wrap(module, ctx, options)

    def sync_setter(self, model: nn.Module) -> SyncSetter | None:
        if not _is_fsdp(model):
            return None

        def set_fsdp(flag: bool) -> None:
            model.set_requires_gradient_sync(flag)  # read by FSDP2 in post-backward

        return set_fsdp

    def count_sync(self, model: nn.Module) -> CountSync | None:
        if not _is_fsdp(model):
            return None  # ran unsharded (one process, no group)
        from splitsync.strategies.count import FsdpCount

        return FsdpCount(model)

    def make_scaler(self, precision: Precision, model: nn.Module | None = None) -> Any:
        if model is not None and not _is_fsdp(model):
            return super().make_scaler(precision, model)  # ran unsharded
        # Every rank sees only its gradient shard: found-inf must be all-reduced so that all
        # ranks skip the same steps.
        return precision.make_scaler(sharded=True)

    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> nn.Module:
        if _is_fsdp(model):
            compile_blocks(model, options)
            return model
        return super().compile(model, options)  # ran unsharded (one process, no group)

    def joinables(self, model: nn.Module) -> list[Any]:
        if _is_fsdp(model):
            raise ValueError(
                "run.join() works with DDP models; FSDP has no uneven-input support in "
                "PyTorch. Give every rank the same number of batches instead, e.g. "
                "run.loader(data, batch_size, drop_last=True)."
            )
        return []

    # --- state: DTensor shards, read and written through torch.distributed.checkpoint ----
    def is_sharded(self, model: nn.Module) -> bool:
        return _state.has_dtensor_params(model)

    def state_module(self, model: nn.Module) -> nn.Module:
        # DCP's helpers read an FSDP2 module as it is (its DTensors, its names)
        return model if _is_fsdp(model) else super().state_module(model)

    # --- an open accumulation window ----------------------------------------------------
    # Inside a window FSDP2 reduce-scatters nothing: each rank keeps its own unsharded
    # gradients, on the unsharded parameter (``unsharded_accumulated_grad`` when it reduces
    # in another dtype). They are read and put back by the user's parameter names; a put back
    # one goes to ``unsharded_accumulated_grad``, onto which FSDP2 adds the next micro-step's
    # gradient and from which it reduce-scatters: the same sum as the interrupted run's.
    def window_grads(self, model: nn.Module) -> dict[str, torch.Tensor]:
        if not _is_fsdp(model):
            return super().window_grads(model)
        out = {}
        for name, fp in _fsdp_params(model).items():
            grad = fp.unsharded_accumulated_grad
            if grad is None and hasattr(fp, "_unsharded_param"):
                grad = fp._unsharded_param.grad
            if grad is not None:
                out[name] = grad
        return out

    def restore_window_grads(self, model: nn.Module, grads: Mapping[str, torch.Tensor]) -> None:
        if not _is_fsdp(model):
            return super().restore_window_grads(model, grads)
        params = _fsdp_params(model)
        for name, grad in grads.items():
            params[name].unsharded_accumulated_grad = grad.to(params[name].device, copy=True)
        return None

    # --- copies (run.ema) ----------------------------------------------------------------
    def template(self, module: nn.Module) -> nn.Module | None:
        # FSDP2 modules refuse deepcopy, so the copy is rebuilt from the structure.
        return meta_copy(module)

    def replica(self, model: nn.Module, template: nn.Module | None, ctx: WrapContext,
                options: Mapping[str, Any]) -> nn.Module:
        if not _is_fsdp(model):
            return super().replica(model, template, ctx, options)  # ran unsharded
        if template is None:
            raise TypeError("an FSDP model can be copied only from the template run.model "
                            "took before wrapping it; pass the model run.model returned.")
        return shard_like(model, self.wrap(meta_copy(template), ctx, options))


STRATEGY = FSDP()
