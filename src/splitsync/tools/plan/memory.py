"""``splitsync plan --memory``: per-device bytes of a model's training state, on fake tensors.

The model is built, run forward and stepped once under ``FakeTensorMode``: every tensor has
a shape, a dtype and a device but no storage, so a 7B model is planned in seconds within a
few hundred MB. From that one pass come (:func:`model_facts`):

- each parameter's shape and dtype, and the optimizer state a real step creates for it
  (the optimizer class itself runs, so SGD, AdamW, amsgrad... all count right);
- the bytes autograd saves for backward (``saved_tensors_hooks``), less the parameters
  themselves, counting each storage once, split into the FSDP blocks they were saved in
  (for activation checkpointing) and what each block received as input.

:func:`plan` turns them into per-device figures for each strategy at each device count
(see ``docs/strategies.md`` for the model of each term).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Variant", "ParamFacts", "ModelFacts", "MemoryPlan", "parse_strategies",
           "model_facts", "plan", "optimizer_class", "PARAM_DTYPES", "AUTOCAST", "param_facts",
           "storage_key", "storage_nbytes"]

BASES = ("ddp", "fsdp", "hsdp")
FLAGS = ("offload", "act-ckpt")
PARAM_DTYPES = {"32": torch.float32, "bf16-mixed": torch.float32, "16-mixed": torch.float32,
                "bf16-true": torch.bfloat16}
AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


@dataclass(frozen=True)
class Variant:
    """One strategy choice: ``ddp``, ``fsdp`` or ``hsdp``, optionally ``+offload`` (FSDP2's
    CPUOffloadPolicy) and ``+act-ckpt`` (activation checkpointing of the FSDP blocks)."""

    base: str
    offload: bool = False
    act_ckpt: bool = False

    @property
    def name(self) -> str:
        return "+".join([self.base] + ["offload"] * self.offload + ["act-ckpt"] * self.act_ckpt)


def parse_strategies(text: str) -> list[Variant]:
    """``"ddp,fsdp+offload,hsdp+act-ckpt"`` -> variants; bad names raise with the fix."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        base, *flags = item.split("+")
        if base not in BASES:
            raise ValueError(f"--strategies: {item!r} starts with {base!r}; start each with one "
                             f"of {', '.join(BASES)}, e.g. fsdp+offload.")
        bad = [f for f in flags if f not in FLAGS]
        if bad:
            raise ValueError(f"--strategies: {item!r} has {bad}; the variants are "
                             f"{', '.join(FLAGS)}, joined with '+' (e.g. fsdp+offload+act-ckpt).")
        if "offload" in flags and base == "ddp":
            raise ValueError(f"--strategies: {item!r}: DDP keeps a full copy on every device and "
                             "cannot offload; use fsdp+offload or hsdp+offload.")
        out.append(Variant(base, "offload" in flags, "act-ckpt" in flags))
    if not out:
        raise ValueError("--strategies: give at least one, e.g. ddp,fsdp,fsdp+act-ckpt.")
    return out


@dataclass(frozen=True)
class ParamFacts:
    """One parameter: its dim-0 size, elements per dim-0 row, element size, and the
    optimizer state it gets (bytes of tensors shaped like it, bytes of the others)."""

    rows: int
    row_numel: int
    itemsize: int
    state_like: int  # per element of the parameter, summed over its param-shaped states
    state_other: int  # bytes of state tensors shaped otherwise (e.g. Adam's step)
    block: int  # index of the FSDP block holding it, -1: the root's own


@dataclass(frozen=True)
class ModelFacts:
    params: tuple[ParamFacts, ...]
    activations: int  # bytes autograd saves for backward, less the parameters
    outside: int  # the part saved outside every block
    block_saved: tuple[int, ...]  # the part saved inside each block
    block_inputs: tuple[int, ...]  # bytes of each block's input (what checkpointing keeps)

    @property
    def numel(self) -> int:
        return sum(p.rows * p.row_numel for p in self.params)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes of one strategy at one device count (the most loaded device)."""

    strategy: str
    devices: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    peak_bytes: int
    host_bytes: int = 0  # offloaded to host memory (per process)
    shard: int = 1  # devices one copy of the state is sharded over
    fits: bool | None = None  # within --memory-gb; None when not given

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """``AdamW``, ``torch.optim.SGD`` or ``pkg.module:Class``."""
    if ":" in name or "." in name:
        mod, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"--optimizer {name!r}: cannot import it ({exc}).") from None
    else:
        found = {n.lower(): getattr(torch.optim, n) for n in dir(torch.optim)
                 if isinstance(getattr(torch.optim, n), type)
                 and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)}
        if name.lower() not in found:
            raise ValueError(f"--optimizer {name!r}: not in torch.optim; choose one of "
                             f"{', '.join(sorted(c.__name__ for c in found.values()))}, or "
                             "give MODULE:CLASS.")
        cls = found[name.lower()]
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"--optimizer {name!r} is not a torch.optim.Optimizer subclass.")
    return cls


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def model_facts(factory: Callable[[], nn.Module], input_shape: Sequence[int], batch_size: int,
                *, input_dtype: torch.dtype = torch.float32, precision: str = "32",
                optimizer: type[torch.optim.Optimizer] = torch.optim.AdamW,
                optimizer_kwargs: dict[str, Any] | None = None,
                blocks: Callable[[nn.Module], list[nn.Module]] | None = None) -> ModelFacts:
    """Build, run forward and step ``factory()`` once on fake tensors; see the module doc."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from splitsync.strategies.fsdp import default_blocks

    if precision not in PARAM_DTYPES:
        raise ValueError(f"precision {precision!r}: choose one of {', '.join(PARAM_DTYPES)}.")
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = factory()
        if PARAM_DTYPES[precision] != torch.float32:
            model = model.to(PARAM_DTYPES[precision])
        found = (blocks or default_blocks)(model)
        block_of = {id(p): i for i, b in enumerate(found) for p in b.parameters()}
        params = [p for p in model.parameters() if p.requires_grad]
        param_keys = {storage_key(p) for p in model.parameters()}
        saved: dict[int, tuple[int, int]] = {}  # storage -> (bytes, block or -1)
        inputs = [0] * len(found)
        active: list[int] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = storage_key(t)
            if key not in param_keys and key not in saved:
                saved[key] = (storage_nbytes(t), active[-1] if active else -1)
            return t

        hooks = []
        for i, b in enumerate(found):
            hooks.append(b.register_forward_pre_hook(_enter(active, inputs, i)))
            hooks.append(b.register_forward_hook(_leave(active)))
        x = (torch.randint(0, 2, (batch_size, *input_shape)) if not input_dtype.is_floating_point
             else torch.randn(batch_size, *input_shape, dtype=input_dtype))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            dtype = AUTOCAST.get(precision)
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                out = model(x)
        for h in hooks:
            h.remove()
        del out
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = optimizer(params, **(optimizer_kwargs or {}))
        opt.step()
        facts = [param_facts(p, opt.state.get(p, {}), block_of.get(id(p), -1)) for p in params]
    per_block = [0] * len(found)
    for nbytes, blk in saved.values():
        if blk >= 0:
            per_block[blk] += nbytes
    total = sum(n for n, _ in saved.values())
    return ModelFacts(tuple(facts), total, total - sum(per_block), tuple(per_block),
                      tuple(inputs))


def _enter(active: list[int], inputs: list[int], i: int) -> Callable[..., None]:
    def pre(module: nn.Module, args: Any) -> None:
        active.append(i)
        inputs[i] = sum(storage_nbytes(a) for a in _tensors(args))

    return pre


def _leave(active: list[int]) -> Callable[..., None]:
    def post(*_: Any) -> None:
        active.pop()

    return post


def _tensors(args: Any) -> Iterable[torch.Tensor]:
    from splitsync.tree import iter_tensors

    return (t for _, t in iter_tensors(args))


def param_facts(p: torch.Tensor, state: dict[str, Any], block: int) -> ParamFacts:
    like = other = 0
    for v in state.values():
        if isinstance(v, torch.Tensor):
            if v.shape == p.shape:
                like += v.element_size()
            else:
                other += v.numel() * v.element_size()
    rows = p.shape[0] if p.dim() else 1
    return ParamFacts(rows, p.numel() // max(rows, 1), p.element_size(), like, other, block)


# --- the per-device model -------------------------------------------------------------------
def _shard_rows(rows: int, n: int) -> int:
    """Rows FSDP2 gives the first rank (dim-0 chunks; storage padded to this on every rank)."""
    return math.ceil(rows / n)


def _hsdp_shard(devices: int, per_node: int) -> int:
    return devices if devices <= per_node else per_node


def plan(facts: ModelFacts, variants: Sequence[Variant], sizes: Sequence[int], *,
         memory_gb: float | None = None, per_node: int = 8,
         grad_itemsize: int | None = None) -> list[MemoryPlan]:
    """Per-device bytes of each variant at each device count."""
    out = []
    for v in variants:
        for n in sizes:
            if n < 1:
                raise ValueError(f"--sizes: {n} devices; give counts >= 1.")
            if v.base == "hsdp" and n > per_node and n % per_node:
                raise ValueError(f"hsdp at {n} devices: shards over {per_node} per node "
                                 f"(--gpus-per-node) must divide {n}; pick a multiple.")
            shard = 1 if v.base == "ddp" else _hsdp_shard(n, per_node) if v.base == "hsdp" else n
            out.append(_one(facts, v, n, shard, memory_gb, grad_itemsize))
    return out


def _one(facts: ModelFacts, v: Variant, n: int, shard: int, memory_gb: float | None,
         grad_itemsize: int | None) -> MemoryPlan:
    params = grads = optim = 0
    unsharded_root = 0
    blocks: dict[int, int] = {}
    for p in facts.params:
        rows = p.rows if shard == 1 else _shard_rows(p.rows, shard)
        local = rows * p.row_numel
        params += local * p.itemsize
        grads += local * (grad_itemsize or p.itemsize)
        # optimizer state is made like the local shard (unpadded on the first rank)
        optim += min(rows, p.rows) * p.row_numel * p.state_like + p.state_other
        full = p.rows * p.row_numel * p.itemsize
        if p.block < 0:
            unsharded_root += full
        else:
            blocks[p.block] = blocks.get(p.block, 0) + full
    acts = facts.activations
    recompute = 0
    if v.act_ckpt and facts.block_saved:
        acts = facts.outside + sum(facts.block_inputs)
        recompute = max(facts.block_saved)  # one block's activations, rebuilt in backward
    host = 0
    if v.offload:
        host, params, grads, optim = params + grads + optim, 0, 0, 0
    if v.base == "ddp" or (shard == 1 and not v.offload):
        # backward ends holding every gradient; AdamW's foreach step adds about one more
        # parameter-sized temporary while activations are gone
        peak = max(params + grads + optim + acts + recompute,
                   params + grads + optim + params)
    else:
        # FSDP2: the root's own parameters stay gathered from forward to backward; a block
        # is gathered while the next one is prefetched, and its unsharded gradient lives
        # until it is reduce-scattered
        biggest = max(blocks.values(), default=0)
        gathered = unsharded_root + 2 * biggest + biggest
        peak = params + grads + optim + acts + recompute + gathered
    fits = None if memory_gb is None else peak <= memory_gb * 1e9
    return MemoryPlan(v.name, n, params, grads, optim, acts, peak, host, shard, fits)
