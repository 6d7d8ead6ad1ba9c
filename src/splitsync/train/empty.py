"""A backward that contributes exactly zero: an empty micro-batch under ``count=0``.

A mean over no item is 0/0. Multiplying that loss by zero does not help: the backward of
the division is ``grad / 0``, so even a zero gradient becomes NaN there, and NaN spreads to
every parameter. Yet the backward must still run through the model: DDP all-reduces and
FSDP reduce-scatters in it, and every rank takes part in every collective. So the graph is
walked once and every node's output gradients are replaced by zeros: each parameter
receives an exact zero, through the same hooks and collectives as any backward.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["backward_zero"]


def _zeros(grad_inputs: tuple[Any, ...], grad_outputs: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(None if g is None else torch.zeros_like(g) for g in grad_inputs)


def backward_zero(loss: torch.Tensor) -> None:
    """``loss.backward()`` with every gradient it produces replaced by exact zeros."""
    if loss.grad_fn is None:
        raise ValueError(
            "run.backward(loss, count=0): the loss has no graph (it does not require grad). "
            "Compute it from the model's output even for a micro-batch without items (a "
            "masked mean is fine); count=0 makes it contribute nothing, and every rank must "
            "still run the backward so that the gradient all-reduce happens everywhere.")
    handles = []
    seen: set[int] = set()
    todo = [loss.grad_fn]
    keep = []  # nodes stay alive (and their ids unique) until the walk is over
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        # A parameter's accumulator outlives this graph (a hook there would stay): it
        # receives the zeros from the node before it.
        if type(node).__name__ != "AccumulateGrad":
            handles.append(node.register_hook(_zeros))
        todo.extend(fn for fn, _ in node.next_functions)
    try:
        loss.backward(torch.zeros_like(loss))
    finally:
        for h in handles:
            h.remove()
