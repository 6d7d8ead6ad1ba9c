"""What one rank really holds in a training step, to check ``plan --memory`` against.

Counts distinct storages (a view costs nothing more than its base): parameters (FSDP2: the
padded local shards), gradients after backward (DDP: its buckets, which the gradients
alias), optimizer state after the step, and what autograd saves in forward
(``saved_tensors_hooks``), less the parameters themselves (FSDP2: the gathered ones).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["held_bytes"]


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _distinct(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = _local(t).untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def held_bytes(run: Any, model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any,
               loss: Callable[[Any], torch.Tensor] | None = None) -> dict[str, int]:
    """One ``run.backward``/``run.step`` of ``model`` on ``batch``, measured on this rank."""
    params = _distinct(model.parameters())
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = _local(t).untyped_storage()  # a DTensor (TP) saves its local shard
        # parameters registered right now: FSDP2 swaps in the gathered ones in forward
        if s.data_ptr() not in {_local(p).untyped_storage().data_ptr()
                                for p in model.parameters()}:
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(batch)
    value = out.float().mean() if loss is None else loss(out)
    run.backward(value)
    grads = _distinct(p.grad for p in model.parameters() if p.grad is not None)
    run.step(optimizer)
    state = _distinct(v for st in optimizer.state.values() for v in st.values()
                      if isinstance(v, torch.Tensor))
    return {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": state,
            "activations_bytes": sum(saved.values())}
