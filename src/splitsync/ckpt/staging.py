"""Staging: the copy of the state a background save writes while training goes on.

The stall of a background save is this copy, so it is made as cheap as it can be: a tensor
is copied only when it still aliases something training will change, and into a buffer kept
from the previous save of the same state (same place, shape and dtype), so a save allocates
nothing and takes no page faults; the copy runs at memory speed. Device tensors go to pinned
buffers with asynchronous copies and one synchronize at the end.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["Stager", "stage", "live_storages"]

# Subtrees of state.pt that the strategies build: their CPU tensors are either views of live
# CPU state (copied) or fresh host copies of device tensors (kept as they are).
_STRATEGY_PARTS = ("model", "optim")


def live_storages(models: Iterable[nn.Module],
                  optimizers: Iterable[torch.optim.Optimizer]) -> frozenset[int]:
    """Data pointers of every CPU storage a model or optimizer holds (what training mutates)."""
    ptrs: set[int] = set()

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            ptrs.add(t.untyped_storage().data_ptr())

    for m in models:
        for t in (*m.parameters(), *m.buffers()):
            add(t)
    for o in optimizers:
        for st in o.state.values():
            for v in st.values():
                add(v)
    return frozenset(ptrs)


class Stager:
    """Host buffers reused from one background save to the next."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def clear(self) -> None:
        """Free the buffers (the run is closing)."""
        self._buffers = {}

    def stage(self, obj: Any, live: frozenset[int] | None = None) -> Any:
        """A copy of ``obj`` that training cannot change: tensors copied into this stager's
        buffers (tied tensors share one copy), other leaves deep-copied. With ``live``, CPU
        tensors under ``state.pt``'s model/optim parts that alias none of those storages are
        private already and kept without a copy."""
        memo: dict[tuple[Any, ...], torch.Tensor] = {}
        pinned = [False]
        used: dict[str, torch.Tensor] = {}

        def copy_tensor(t: torch.Tensor, path: str) -> torch.Tensor:
            t = t.detach()
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                   t.stride(), t.dtype, t.device)
            if key in memo:
                return memo[key]
            pin = t.device.type == "cuda"
            buf = self._buffers.get(path)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or \
                    buf.is_pinned() != pin:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
            buf.copy_(t, non_blocking=pin)
            pinned[0] |= pin
            used[path] = memo[key] = buf
            return buf

        def private(t: torch.Tensor) -> bool:
            return (live is not None and t.device.type == "cpu"
                    and t.untyped_storage().data_ptr() not in live
                    and t.untyped_storage().data_ptr() != 0)

        def go(x: Any, path: str, keep: Callable[[torch.Tensor], bool] | None) -> Any:
            if isinstance(x, torch.Tensor):
                return x.detach() if keep is not None and keep(x) else copy_tensor(x, path)
            if isinstance(x, dict):
                items = {k: go(v, f"{path}/{k}", private if path.endswith(".pt") and
                               k in _STRATEGY_PARTS else keep) for k, v in x.items()}
                return items if type(x) is dict else type(x)(items)
            if isinstance(x, list):
                return [go(v, f"{path}/{i}", keep) for i, v in enumerate(x)]
            if isinstance(x, tuple) and not hasattr(x, "_fields"):
                return tuple(go(v, f"{path}/{i}", keep) for i, v in enumerate(x))
            return copy.deepcopy(x)

        out = go(obj, "", None)
        self._buffers = used  # buffers of state that is gone are freed
        if pinned[0]:
            torch.cuda.synchronize()  # the copies are complete before training goes on
        return out


def stage(obj: Any) -> Any:
    """A one-off staged copy of ``obj`` (fresh buffers)."""
    return Stager().stage(obj)
