"""Tensor parallelism on the run's mesh, then FSDP2 over its data-parallel dimensions.

``run.model(m, tp_plan=plan)`` under ``init(mesh=...)``: ``parallelize_module`` splits the
layers the plan names over the mesh's ``"tp"`` dimension (PyTorch's ``ColwiseParallel``,
``RowwiseParallel``, ``SequenceParallel``...; ``"auto"``: a Hugging Face model's own
``base_model_tp_plan``), then ``fully_shard`` shards every parameter over the data-parallel
dimensions (``dp_shard``; with ``dp_replicate`` > 1 as HSDP), as torchtitan composes them.
Parameters are DTensors on the mesh, so state goes through DCP and reshards to any other
layout. With ``tp`` = 1 the plan has nothing to split and is not applied; with one
data-parallel replica there is no FSDP. Everything after wrapping is FSDP's, except what
depends on the data-parallel size (gradient averaging divides by it, not the world size).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from splitsync.strategies.base import SyncSetter, WrapContext, meta_copy
from splitsync.strategies.fsdp import FSDP, shard, shard_like
from splitsync.strategies.fsdp import OPTIONS as FSDP_OPTIONS

if TYPE_CHECKING:
    from splitsync.strategies.count import CountSync

__all__ = ["TP", "STRATEGY", "OPTIONS", "PLAN_STYLES", "resolve_plan", "check_plan",
           "is_tp"]

OPTIONS = (*FSDP_OPTIONS, "tp_plan")

#: The names a Hugging Face ``base_model_tp_plan`` uses, and the PyTorch style each means.
PLAN_STYLES: tuple[str, ...] = ("colwise", "rowwise", "colwise_rep", "colwise_gather_output",
                                "sequence_parallel")

_log = logging.getLogger("splitsync")


def _style(name: str, where: str) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":
        return RowwiseParallel()
    if name in ("colwise_rep", "colwise_gather_output"):
        return ColwiseParallel(output_layouts=Replicate())
    if name == "sequence_parallel":
        return SequenceParallel()
    raise ValueError(f"tp_plan: {where} is {name!r}, a style splitsync does not map; give "
                     f"one of {', '.join(PLAN_STYLES)}, or a PyTorch ParallelStyle in a plan "
                     "of your own (run.model(m, tp_plan={...})).")


def _auto_plan(module: nn.Module) -> dict[str, Any]:
    """A Hugging Face model's ``config.base_model_tp_plan``, keyed from ``module``."""
    config = getattr(module, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    if not plan:
        raise ValueError(
            f'tp_plan="auto" takes the Hugging Face model\'s config.base_model_tp_plan, but '
            f"{type(module).__name__} has none; pass a plan of your own: "
            "{'layers.*.attn.q': ColwiseParallel(), ...} (docs/tensor-parallel.md).")
    base = getattr(module, "base_model", module)
    prefix = ""
    if base is not module:  # a model with a head: the plan is written from its base model
        names = {m: n for n, m in module.named_modules()}
        prefix = names.get(base, "")
        prefix = f"{prefix}." if prefix else ""
    return {f"{prefix}{k}": _style(v, repr(k)) for k, v in plan.items()}


def resolve_plan(module: nn.Module, plan: Any) -> dict[str, Any]:
    """``tp_plan`` as ``{module path (``*`` allowed): ParallelStyle}``: "auto" read from the
    model, a user's mapping with strings turned into styles; checked against the module."""
    from torch.distributed.tensor.parallel import ParallelStyle

    if isinstance(plan, str):
        if plan != "auto":
            raise ValueError(f"tp_plan={plan!r}: give \"auto\" (the Hugging Face model's "
                             "base_model_tp_plan) or a dict {module path: ParallelStyle}.")
        out = _auto_plan(module)
    elif isinstance(plan, Mapping):
        out = {}
        for key, style in plan.items():
            if isinstance(style, str):
                style = _style(style, repr(key))
            elif not isinstance(style, ParallelStyle):
                raise TypeError(f"tp_plan[{key!r}] is a {type(style).__name__}; give a PyTorch "
                                "ParallelStyle (ColwiseParallel(), RowwiseParallel(), "
                                f"SequenceParallel(), ...) or one of {', '.join(PLAN_STYLES)}.")
            out[str(key)] = style
    else:
        raise TypeError(f"tp_plan={plan!r}: give \"auto\" or a dict {{module path: "
                        "ParallelStyle}}.")
    check_plan(module, out)
    return out


def check_plan(module: nn.Module, plan: Mapping[str, Any]) -> None:
    """Refuse a plan entry that names no submodule of ``module`` (a typo, or a plan written
    for another model), naming the entry and the nearest path that exists."""
    paths = [n for n, _ in module.named_modules() if n]
    for key in plan:
        if any(fnmatch.fnmatchcase(p, key) for p in paths):
            continue
        import difflib

        close = difflib.get_close_matches(key, paths, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"tp_plan names {key!r}, but {type(module).__name__} has no such "
                         f"submodule.{hint} Paths are those of model.named_modules() ('*' "
                         "matches one level: 'layers.*.attn.q').")


def is_tp(model: nn.Module) -> bool:
    """Whether some parameter of ``model`` is a DTensor on a mesh with a ``"tp"`` dimension."""
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p, DTensor):
            names = p.device_mesh.mesh_dim_names or ()
            if "tp" in names:
                return True
    return False


def dp_mesh(mesh: Any, shape: Any) -> Any:
    """The data-parallel part of the run's mesh that FSDP2 shards over (2-D with replicas)."""
    if shape.dp_replicate > 1:
        return mesh[("dp_replicate", "dp_shard")]
    return mesh["dp_shard"]


def _wrap(module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
    shape = ctx.mesh_shape
    if shape is None:
        raise ValueError("strategy 'tp' takes its layout from init(mesh={'dp_shard': -1, "
                         "'tp': 2}); pass mesh= to splitsync.init.")
    given = options.get("tp_plan")
    plan = resolve_plan(module, given) if given is not None else {}
    rest = {k: v for k, v in options.items() if k != "tp_plan"}
    if ctx.mesh is None:  # one process: nothing to split or shard
        if plan and ctx.rank == 0:
            _log.info("tp_plan: one process, so the plan splits nothing; the model runs whole.")
        return module.to(ctx.device)
    if shape.tp > 1 and plan:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(module, ctx.mesh["tp"], plan)
    elif shape.tp > 1:
        raise ValueError(f"init(mesh=...) has tp={shape.tp}, but run.model got no tp_plan: "
                         "pass run.model(m, tp_plan={...}) (or tp_plan=\"auto\" for a Hugging "
                         "Face model), or make the mesh tp=1.")
    if shape.dp_size == 1:
        unused = sorted(k for k in ("offload", "blocks", "reshard_after_forward") if k in rest)
        if unused:
            raise ValueError(f"run.model({', '.join(f'{k}=' for k in unused)}...): these "
                             "are FSDP2's options over the data-parallel dims, and this mesh "
                             f"has one replica ({shape.as_dict()}): nothing is sharded. Drop "
                             "them, or give the mesh dp_shard > 1.")
        return module
    return shard(module, ctx, rest, dp_mesh(ctx.mesh, shape), "tp")


def _is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class TP(FSDP):
    """``parallelize_module`` over the mesh's ``tp``, FSDP2 over its data-parallel dims."""

    name = "tp"
    options = OPTIONS

    def owns(self, model: nn.Module) -> bool:
        return is_tp(model)

    def wrap(self, module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
        return _wrap(module, ctx, options)

    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> nn.Module:
        if is_tp(model):
            raise ValueError("run.model(compile=...) with a tensor-parallel plan is not "
                             "supported yet: compile the blocks yourself after run.model, or "
                             "drop compile= (or make the mesh tp=1).")
        return super().compile(model, options)

    def sync_setter(self, model: nn.Module) -> SyncSetter | None:
        if not _is_fsdp(model):
            return None  # one data-parallel replica: no gradient is reduced across replicas

        def set_sync(flag: bool) -> None:
            model.set_requires_gradient_sync(flag)
            model.set_requires_all_reduce(flag)  # the replicas' all-reduce (dp_replicate > 1)

        return set_sync

    def count_sync(self, model: nn.Module) -> CountSync | None:
        if not _is_fsdp(model):
            return None  # the step rescales
        from splitsync.strategies.count import FsdpCount

        # FSDP2 averaged over the data-parallel ranks only (the TP ranks hold other slices)
        mesh = next((p.device_mesh for p in model.parameters()
                     if hasattr(p, "device_mesh")), None)
        names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        ranks = 1
        for dim in ("dp_replicate", "dp_shard"):
            if dim in names:
                ranks *= mesh.size(names.index(dim))
        return FsdpCount(model, ranks=ranks)

    def joinables(self, model: nn.Module) -> list[Any]:
        raise ValueError("run.join() works with DDP models; a tensor-parallel model has no "
                         "uneven-input support. Give every rank the same number of batches, "
                         "e.g. run.loader(data, batch_size, drop_last=True).")

    def replica(self, model: nn.Module, template: nn.Module | None, ctx: WrapContext,
                options: Mapping[str, Any]) -> nn.Module:
        if ctx.mesh is None:
            return super().replica(model, template, ctx, options)  # whole, one process
        if template is None:
            raise TypeError("a tensor-parallel model can be copied only from the template "
                            "run.model took before wrapping it; pass the model run.model "
                            "returned.")
        return shard_like(model, self.wrap(meta_copy(template), ctx, options))


STRATEGY = TP()
