"""``plan --memory --tp 2,4``: per-rank bytes of tensor parallelism, then FSDP2 over the rest.

A TP plan (``{module path: ParallelStyle}``, or ``"auto"``: a Hugging Face model's own)
splits the planned layers over ``tp`` ranks: ``ColwiseParallel`` shards a Linear's weight
and bias by output rows, ``RowwiseParallel`` a Linear's weight by input columns (its bias
stays whole) and an Embedding's table by rows. Gradients and optimizer state are shaped like
the local shards. FSDP2 over the ``devices / tp`` data-parallel ranks then shards each
local tensor by dim 0, as :func:`splitsync.tools.plan.memory.plan` models it.

Activations come from one forward on fake tensors, as in ``memory.model_facts``: a tensor
autograd saves is divided by ``tp`` when it is a shard (made between a ``ColwiseParallel``
layer that hands on its local output and the ``RowwiseParallel`` layer that reduces it, or
the input a rowwise layer saves); the input a colwise layer saves is whole on every rank.
``SequenceParallel`` and other styles are counted whole (the estimate errs high there).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from splitsync.tools.plan.memory import (
    AUTOCAST,
    PARAM_DTYPES,
    MemoryPlan,
    ModelFacts,
    ParamFacts,
    Variant,
    param_facts,
    plan,
    storage_key,
    storage_nbytes,
)

__all__ = ["tp_facts", "tp_plan", "parse_tp"]


def parse_tp(text: str) -> list[int]:
    """``"2,4"`` -> ``[2, 4]``; a size below 2 raises with the fix."""
    sizes = [int(s) for s in text.split(",") if s.strip()]
    bad = [s for s in sizes if s < 2]
    if bad or not sizes:
        raise ValueError(f"--tp {text!r}: give tensor-parallel sizes >= 2, e.g. --tp 2,4.")
    return sizes


def _style_kind(style: Any) -> str:
    """``colwise`` (hands on its shard), ``colwise_rep`` (gathers), ``rowwise`` or ``other``."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if isinstance(style, ColwiseParallel):
        layouts = style.output_layouts
        layouts = layouts if isinstance(layouts, tuple) else (layouts,)
        return "colwise_rep" if any(isinstance(p, Replicate) for p in layouts) else "colwise"
    if isinstance(style, RowwiseParallel):
        return "rowwise"
    return "other"


def _local(p: ParamFacts, name: str, module: nn.Module, kind: str, tp: int) -> ParamFacts:
    """The facts of one TP rank's shard of parameter ``name`` of ``module``."""
    if kind == "other":
        return p
    embedding = isinstance(module, nn.Embedding)
    if kind.startswith("colwise"):
        by_rows = not embedding  # a colwise Embedding splits the embedding dimension
    else:
        if name == "bias":
            return p  # a rowwise bias is added after the reduction: whole on every rank
        by_rows = embedding
    if by_rows:
        return replace(p, rows=-(-p.rows // tp))
    return replace(p, row_numel=-(-p.row_numel // tp))


def tp_facts(factory: Callable[[], nn.Module], input_shape: Sequence[int], batch_size: int,
             tp: int, tp_plan: Any, *, input_dtype: torch.dtype = torch.float32,
             precision: str = "32", optimizer: type[torch.optim.Optimizer] = torch.optim.AdamW,
             optimizer_kwargs: dict[str, Any] | None = None) -> ModelFacts:
    """What one rank of a TP group of ``tp`` holds, from one fake forward and step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from splitsync.strategies.fsdp import default_blocks
    from splitsync.strategies.tp import resolve_plan

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = factory()
        if PARAM_DTYPES.get(precision, torch.float32) != torch.float32:
            model = model.to(PARAM_DTYPES[precision])
        styles = resolve_plan(model, tp_plan)
        kinds = {n: next((_style_kind(s) for k, s in styles.items()
                          if fnmatch.fnmatchcase(n, k)), None)
                 for n, _ in model.named_modules()}
        blocks = default_blocks(model)
        block_of = {id(p): i for i, b in enumerate(blocks) for p in b.parameters()}
        saved: dict[int, int] = {}
        param_keys = {storage_key(p) for p in model.parameters()}
        state = {"sharded": False, "inside": [None]}

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = storage_key(t)
            if key in param_keys or key in saved:
                return t
            inside = state["inside"][-1]
            shard = inside == "rowwise" or (inside is None and state["sharded"])
            saved[key] = storage_nbytes(t) // tp if shard else storage_nbytes(t)
            return t

        hooks = []
        for name, module in model.named_modules():
            if kinds.get(name) in ("colwise", "colwise_rep", "rowwise"):
                hooks.append(module.register_forward_pre_hook(_enter(state, kinds[name])))
                hooks.append(module.register_forward_hook(_leave(state, kinds[name])))
        x = (torch.randint(0, 2, (batch_size, *input_shape)) if not input_dtype.is_floating_point
             else torch.randn(batch_size, *input_shape, dtype=input_dtype))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            dtype = AUTOCAST.get(precision)
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                out = model(x)
        for h in hooks:
            h.remove()
        del out
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        for _, p in params:
            p.grad = torch.zeros_like(p)
        opt = optimizer([p for _, p in params], **(optimizer_kwargs or {}))
        opt.step()
        owners = {id(p): (m, n.rsplit(".", 1)[-1], mod) for m, mod in model.named_modules()
                  for n, p in mod.named_parameters(recurse=False)}
        facts = []
        for _, p in params:
            owner, leaf, module = owners[id(p)]
            full = param_facts(p, opt.state.get(p, {}), block_of.get(id(p), -1))
            facts.append(_local(full, leaf, module, kinds.get(owner) or "other", tp))
    total = sum(saved.values())
    return ModelFacts(tuple(facts), total, total, (), ())


def _enter(state: dict[str, Any], kind: str) -> Callable[..., None]:
    def pre(*_: Any) -> None:
        state["inside"].append(kind)

    return pre


def _leave(state: dict[str, Any], kind: str) -> Callable[..., None]:
    def post(*_: Any) -> None:
        state["inside"].pop()
        # a colwise layer hands its shard on until a rowwise layer reduces it
        state["sharded"] = kind == "colwise"

    return post


def tp_plan(facts: Mapping[int, ModelFacts], sizes: Sequence[int], *,
            memory_gb: float | None = None, grad_itemsize: int | None = None
            ) -> list[MemoryPlan]:
    """Per-rank bytes of ``tp{tp}+fsdp`` at each device count ``tp`` divides (``facts``:
    :func:`tp_facts` by tp size); FSDP2 shards over the ``devices / tp`` replicas."""
    out = []
    for tp, f in facts.items():
        for n in sizes:
            if n % tp:
                continue  # a mesh needs tp to divide the device count
            (row,) = plan(f, [Variant("fsdp")], [n // tp], memory_gb=memory_gb,
                          grad_itemsize=grad_itemsize)
            out.append(replace(row, strategy=f"tp{tp}+fsdp", devices=n))
    return out
