"""FSDP2: ``fully_shard`` on each repeated block, then on the root.

Parameters, gradients and optimizer state are sharded across ranks; each block's
parameters are all-gathered just before its forward/backward and freed after. The
mixed-precision policy follows the run's precision.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from splitsync.strategies import Strategy, WrapContext

OPTIONS = ("blocks", "reshard_after_forward")

_log = logging.getLogger("splitsync")


def mixed_precision_policy(precision: str) -> Any:
    """FSDP2 policy for a precision name: compute dtype for mixed, fp32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if precision == "16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # "32"; "bf16-true" parameters already are bf16


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


def _no_sync(model: nn.Module) -> AbstractContextManager[None]:
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return _gradient_sync_off(model)
    return nullcontext()


@contextmanager
def _gradient_sync_off(model: Any) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


STRATEGY = Strategy(name="fsdp", wrap=_wrap, no_sync=_no_sync, options=OPTIONS)
