"""FSDP2: ``fully_shard`` on each repeated block, then on the root.

Parameters, gradients and optimizer state are sharded across ranks; each block's
parameters are all-gathered just before its forward/backward and freed after. The
mixed-precision policy follows the run's precision; state is read and written through
``torch.distributed.checkpoint.state_dict`` (sharded, or gathered whole).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from splitsync.strategies import state as _state
from splitsync.strategies.base import Strategy, SyncSetter, WrapContext

if TYPE_CHECKING:
    from splitsync.train.precision import Precision

OPTIONS = ("blocks", "reshard_after_forward")

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


def default_blocks(module: nn.Module) -> list[nn.Module]:
    """Instances of the repeated submodule type holding the most parameters.

    Repeated composite types (transformer blocks) win over repeated layers (the Linear
    layers inside them); a plain MLP yields its Linear layers. Only the outermost
    instances of the chosen type are returned.
    """
    counts: Counter[type[nn.Module]] = Counter()
    sizes: Counter[type[nn.Module]] = Counter()
    composite: set[type[nn.Module]] = set()
    for sub in module.modules():
        if sub is module or isinstance(sub, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            continue
        n = sum(p.numel() for p in sub.parameters())
        if n:
            counts[type(sub)] += 1
            sizes[type(sub)] += n
            if any(True for _ in sub.children()):
                composite.add(type(sub))
    repeated = [t for t, c in counts.items() if c >= 2]
    if not repeated:
        return []
    chosen = max(repeated, key=lambda t: (t in composite, sizes[t]))
    return list(_outermost(module, chosen))


def _outermost(module: nn.Module, kind: type[nn.Module]) -> Iterator[nn.Module]:
    for child in module.children():
        if isinstance(child, kind):
            yield child
        else:
            yield from _outermost(child, kind)


def _blocks(module: nn.Module, given: Any) -> list[nn.Module]:
    if given is None:
        return default_blocks(module)
    if isinstance(given, type) or isinstance(given, nn.Module):
        given = [given]
    types = tuple(g for g in given if isinstance(g, type))
    mods = [g for g in given if isinstance(g, nn.Module)]
    bad = [g for g in given if not isinstance(g, (type, nn.Module))]
    if bad or (types and not all(issubclass(t, nn.Module) for t in types)):
        raise TypeError(
            f"fsdp blocks={given!r}: give module types (e.g. [Block]) or module instances."
        )
    inside = {id(m) for m in module.modules()}
    stray = [type(m).__name__ for m in mods if id(m) not in inside or m is module]
    if stray:
        raise ValueError(f"fsdp blocks: {stray} are not submodules of the model.")
    found = list(_outermost(module, types)) if types else []
    if types and not found:
        raise ValueError(
            f"fsdp blocks: the model has no submodule of type "
            f"{[t.__name__ for t in types]}."
        )
    return found + [m for m in mods if all(m is not f for f in found)]


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


def _wrap(module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
    if not dist.is_initialized():
        if ctx.world_size == 1:
            # One process holds everything anyway; sharding over one rank would only add
            # the DTensor machinery. Say so rather than pretend.
            _log.warning("strategy='fsdp' in a single process without a process group: "
                         "the model runs unsharded. Launch with `splitsync run -n N` to shard.")
            return module
        raise RuntimeError(
            "strategy='fsdp' needs a process group. Launch with `splitsync run -n N script.py` "
            "(or torchrun)."
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(ctx.device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mixed_precision_policy(ctx.precision)}
    if "reshard_after_forward" in options:
        kwargs["reshard_after_forward"] = options["reshard_after_forward"]
    for block in _blocks(module, options.get("blocks")):
        fully_shard(block, **kwargs)
    return fully_shard(module, **kwargs)


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

    def wrap(self, module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
        return _wrap(module, ctx, options)

    def sync_setter(self, model: nn.Module) -> SyncSetter | None:
        if not _is_fsdp(model):
            return None

        def set_fsdp(flag: bool) -> None:
            model.set_requires_gradient_sync(flag)  # read by FSDP2 in post-backward

        return set_fsdp

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


STRATEGY = FSDP()
