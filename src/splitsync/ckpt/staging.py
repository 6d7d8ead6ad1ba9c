"""Staging: the copy of the state a background save writes while training goes on.

The stall of a background save is this copy, so it is made as cheap as it can be: a tensor
is copied only when it still aliases something training will change, and into a buffer kept
from the previous save of the same state (same place, shape and dtype), so a save allocates
nothing and takes no page faults; the copy runs at memory speed. The buffers can be made
before the first save (:meth:`Stager.reserve`, on a thread while training goes on), so the
first save stalls no longer than the others. Device tensors go to pinned buffers with
asynchronous copies and one synchronize at the end.

DTensors (FSDP2 shards, on a mesh of any shape) are staged by their local shard: the copy is
wrapped back as a DTensor with the same mesh, placements, shape and stride, which is all
``torch.distributed.checkpoint`` needs to write it.

Every save also takes host copies of each rank's own buffers (:func:`rank_buffers`: BatchNorm
statistics differ by rank), which its rank file keeps and a resume gives back to that rank.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from splitsync.strategies.modules import unwrap

__all__ = ["Stager", "stage", "live_storages", "local_tensor", "rank_buffers",
           "restore_rank_buffers"]

# Subtrees of state.pt that the strategies build: their CPU tensors are either views of live
# CPU state (copied) or fresh host copies of device tensors (kept as they are).
_STRATEGY_PARTS = ("model", "optim")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s data on this rank (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def live_storages(models: Iterable[nn.Module],
                  optimizers: Iterable[torch.optim.Optimizer]) -> frozenset[int]:
    """Data pointers of every CPU storage a model or optimizer holds (what training mutates)."""
    ptrs: set[int] = set()

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            t = local_tensor(t)  # a DTensor has no storage of its own; its shard does
            if t.device.type == "cpu":
                ptrs.add(t.untyped_storage().data_ptr())

    for m in models:
        for t in (*m.parameters(), *m.buffers()):
            add(t)
    for o in optimizers:
        for st in o.state.values():
            for v in st.values():
                add(v)
    return frozenset(ptrs)


def _fits(buf: torch.Tensor | None, t: torch.Tensor, pin: bool) -> bool:
    return (buf is not None and buf.shape == t.shape and buf.dtype == t.dtype
            and buf.is_pinned() == pin)


def _empty(t: torch.Tensor, pin: bool) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)


class Stager:
    """Host buffers reused from one background save to the next."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._reserving: threading.Thread | None = None

    def clear(self) -> None:
        """Free the buffers (the run is closing)."""
        self._join()
        self._buffers = {}

    def _join(self) -> None:
        if self._reserving is not None:
            self._reserving.join()
            self._reserving = None

    @property
    def nbytes(self) -> int:
        """Host memory held by the buffers."""
        self._join()
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def reserve(self, obj: Any, live: frozenset[int] | None = None) -> None:
        """Make (and touch, so no page fault is left for the save) the buffers a later
        :meth:`stage` of ``obj`` will use, on a thread: only shapes and dtypes are read, so
        training may go on meanwhile. :meth:`stage` waits for it."""
        self._join()
        wanted: dict[str, tuple[torch.Tensor, bool]] = {}

        def note(t: torch.Tensor, path: str) -> torch.Tensor:
            local = local_tensor(t.detach())
            wanted[path] = (torch.empty(local.shape, dtype=local.dtype, device="meta"),
                            local.device.type == "cuda")
            return t

        self._walk(obj, live, note)

        def fill() -> None:
            for path, (meta, pin) in wanted.items():
                if not _fits(self._buffers.get(path), meta, pin):
                    buf = _empty(meta, pin)
                    if buf.numel():
                        buf.view(-1)[:: max(1, 4096 // buf.element_size())].zero_()  # fault in
                    self._buffers[path] = buf

        self._reserving = threading.Thread(target=fill, name="ckpt-reserve", daemon=True)
        self._reserving.start()

    def stage(self, obj: Any, live: frozenset[int] | None = None) -> Any:
        """A copy of ``obj`` that training cannot change: tensors copied into this stager's
        buffers (tied tensors share one copy), other leaves deep-copied. With ``live``, CPU
        tensors under ``state.pt``'s model/optim parts that alias none of those storages are
        private already and kept without a copy."""
        self._join()
        memo: dict[tuple[Any, ...], torch.Tensor] = {}
        pinned = [False]
        used: dict[str, torch.Tensor] = {}

        def copy_tensor(t: torch.Tensor, path: str) -> torch.Tensor:
            from torch.distributed.tensor import DTensor

            t = t.detach()
            local = local_tensor(t)
            key = (local.untyped_storage().data_ptr(), local.storage_offset(),
                   tuple(local.shape), local.stride(), local.dtype, local.device,
                   isinstance(t, DTensor))
            if key in memo:
                return memo[key]
            pin = local.device.type == "cuda"
            buf = self._buffers.get(path)
            if not _fits(buf, local, pin):
                buf = _empty(local, pin)
            assert buf is not None
            buf.copy_(local, non_blocking=pin)
            pinned[0] |= pin
            used[path] = buf
            out = buf
            if isinstance(t, DTensor):
                out = DTensor.from_local(buf, t.device_mesh, t.placements, run_check=False,
                                         shape=t.shape, stride=t.stride())
            memo[key] = out
            return out

        out = self._walk(obj, live, copy_tensor)
        self._buffers = used  # buffers of state that is gone are freed
        if pinned[0]:
            torch.cuda.synchronize()  # the copies are complete before training goes on
        return out

    @staticmethod
    def _walk(obj: Any, live: frozenset[int] | None,
              copy_tensor: Callable[[torch.Tensor, str], torch.Tensor]) -> Any:
        def private(t: torch.Tensor) -> bool:
            return (live is not None and t.device.type == "cpu"
                    and not hasattr(t, "device_mesh")
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

        return go(obj, "", None)


def stage(obj: Any) -> Any:
    """A one-off staged copy of ``obj`` (fresh buffers)."""
    return Stager().stage(obj)


# --- each rank's own buffers -------------------------------------------------------------
def rank_buffers(models: Mapping[str, nn.Module]) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's persistent floating-point buffers of each model, host copies by the
    user's names. BatchNorm's running statistics differ by rank (under DDP each rank's
    forward updates its own after DDP's broadcast; an EMA averages each rank's), so every
    rank keeps its own in its rank file and a resume gives each rank back its own."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, model in models.items():
        own = {}
        for prefix, mod in unwrap(model).named_modules():
            for key, buf in mod.named_buffers(recurse=False):
                if buf is None or not buf.is_floating_point() or \
                        key in mod._non_persistent_buffers_set:
                    continue
                local = getattr(buf, "to_local", None)
                t = local() if local is not None else buf
                own[f"{prefix}.{key}" if prefix else key] = t.detach().to("cpu", copy=True)
        if own:
            out[name] = own
    return out


@torch.no_grad()
def restore_rank_buffers(models: Mapping[str, nn.Module],
                         saved: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """Inverse of :func:`rank_buffers`, for the models and buffers both sides have."""
    for name, model in models.items():
        mine = saved.get(name)
        if not mine:
            continue
        for key, buf in unwrap(model).named_buffers():
            t = mine.get(key)
            if t is None or not buf.is_floating_point():
                continue
            local = getattr(buf, "to_local", None)
            target = local() if local is not None else buf
            if target.shape == t.shape:
                target.copy_(t)
