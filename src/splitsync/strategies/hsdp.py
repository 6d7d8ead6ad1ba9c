"""HSDP: FSDP2 over a 2-D mesh, sharded inside a group of ranks and replicated across groups.

``fully_shard`` over a ``("replicate", "shard")`` :class:`DeviceMesh` gives every parameter
the placements ``(Replicate(), Shard(0))``: the all-gathers and reduce-scatters run inside
a shard group (by default the processes of one node, on the fast links) and only the
reduced gradient shards are all-reduced across replicas (across nodes). Everything after
wrapping (state through DCP, compile, the sharded GradScaler) is FSDP's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torch import nn

from splitsync.strategies.base import SyncSetter, WrapContext
from splitsync.strategies.fsdp import FSDP, shard, unsharded
from splitsync.strategies.fsdp import OPTIONS as FSDP_OPTIONS

__all__ = ["HSDP", "STRATEGY", "OPTIONS", "MESH_DIMS", "mesh_shape", "is_hsdp"]

OPTIONS = (*FSDP_OPTIONS, "replicate", "shard")
MESH_DIMS = ("replicate", "shard")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _size(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"strategy='hsdp' {name}={value!r}: give a number of ranks >= 1.")
    return value


def mesh_shape(world_size: int, local_world_size: int | None = None,
               replicate: Any = None, shard: Any = None) -> tuple[int, int]:
    """``(replicate, shard)`` with ``replicate * shard == world_size``.

    Either may be given; by default a shard group is the processes of one node
    (``local_world_size``) and the replicas are the nodes.
    """
    r, s = _size(replicate, "replicate"), _size(shard, "shard")
    fits = _divisors(world_size)
    if r is not None and world_size % r:
        raise ValueError(
            f"strategy='hsdp' replicate={r} does not divide the world size {world_size} "
            f"(replicate x shard must equal it): pass replicate= one of {fits}, or shard= "
            "instead.")
    if s is not None and world_size % s:
        raise ValueError(
            f"strategy='hsdp' shard={s} does not divide the world size {world_size} "
            f"(replicate x shard must equal it): pass shard= one of {fits}, or replicate= "
            "instead.")
    if r is not None and s is not None and r * s != world_size:
        raise ValueError(
            f"strategy='hsdp' replicate={r} x shard={s} = {r * s}, but the world size is "
            f"{world_size}: pass only one of them, or two whose product is {world_size}.")
    if r is not None:
        return r, world_size // r
    if s is None:
        s = local_world_size or world_size
        if world_size % s:
            raise ValueError(
                f"strategy='hsdp': the {s} processes of a node do not divide the world size "
                f"{world_size} (nodes with different process counts); pass replicate= or "
                f"shard= one of {fits}.")
    return world_size // s, s


def is_hsdp(model: nn.Module) -> bool:
    """Whether ``model`` is an FSDP2 module whose parameters live on a 2-D mesh."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if not isinstance(model, FSDPModule):
        return False
    for p in model.parameters():
        if isinstance(p, DTensor):
            return p.device_mesh.ndim == 2
    return False


def _wrap(module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
    world = dist.get_world_size() if dist.is_initialized() else ctx.world_size
    # Checked before anything else, so a wrong size fails the same way with or without a group.
    r, s = mesh_shape(world, ctx.local_world_size, options.get("replicate"),
                      options.get("shard"))
    if not dist.is_initialized():
        return unsharded(module, ctx, options, "hsdp")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(ctx.device.type, (r, s), mesh_dim_names=MESH_DIMS)
    rest = {k: v for k, v in options.items() if k not in ("replicate", "shard")}
    return shard(module, ctx, rest, mesh, "hsdp")


class HSDP(FSDP):
    """FSDP2 sharded within ``shard`` ranks and replicated ``replicate`` times."""

    name = "hsdp"
    options = OPTIONS

    def owns(self, model: nn.Module) -> bool:
        return is_hsdp(model)

    def wrap(self, module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
        return _wrap(module, ctx, options)

    def sync_setter(self, model: nn.Module) -> SyncSetter | None:
        if not is_hsdp(model):
            return super().sync_setter(model)  # ran unsharded, or sharded on a 1-D mesh

        def set_hsdp(flag: bool) -> None:
            # Off: neither the reduce-scatter inside a shard group nor the all-reduce across
            # replicas runs; the unsharded gradients accumulate until the stepping micro-step.
            model.set_requires_gradient_sync(flag)
            model.set_requires_all_reduce(flag)

        return set_hsdp


STRATEGY = HSDP()
