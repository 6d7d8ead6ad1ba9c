"""Unsharded state files: written with torch.save, read back with ``weights_only=True``."""

from __future__ import annotations

import io
import json
import os
import pickle
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.model_state import (
    check_optimizer_names,
    is_sharded,
    load_model_state,
    load_optimizer_state,
    state_shapes,
)
from splitsync.ckpt.state import check_shapes
from splitsync.ckpt.store import CheckpointError

__all__ = ["write_pt", "load_pt", "split_extra", "held_state", "Freeing", "free_later",
           "load_full"]


def write_pt(path: Path, obj: Any) -> None:
    """``torch.save`` to ``path``, flushed and fsynced before returning."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def load_pt(path: Path) -> Any:
    """``torch.load(weights_only=True)``; a pickled payload is refused, never executed."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"refused to load {path}: it holds pickled objects other than tensors and plain "
            f"containers, and loading them could run code ({first}). Only resume from "
            "checkpoints you trust.") from None


def split_extra(extra: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """JSON-serialisable extras go into the manifest, tensors (or containers of them) to a file."""
    plain, tensors = {}, {}
    for key, value in extra.items():
        try:
            json.dumps(value)
            plain[key] = value
            continue
        except (TypeError, ValueError):
            pass
        try:  # tensors in plain containers survive a weights_only round trip
            buf = io.BytesIO()
            torch.save(value, buf)
            buf.seek(0)
            torch.load(buf, weights_only=True)
        except Exception:
            raise TypeError(f"run.save(..., {key}=...): a {type(value).__name__} is neither "
                            "JSON-serialisable nor tensors in plain containers.") from None
        tensors[key] = value
    return plain, tensors


def held_state(optimizer: torch.optim.Optimizer) -> dict[Any, dict[str, Any]]:
    """References to ``optimizer``'s per-parameter state (copies of the dicts, never the live
    ones): they keep its tensors alive after a load replaces them, for :func:`free_later`."""
    return {p: dict(st) for p, st in optimizer.state.items()}


@dataclass(frozen=True)
class Freeing:
    """The thread of :func:`free_later`."""

    thread: threading.Thread
    hurry: threading.Event

    def finish(self) -> None:
        """Free what is left now, without pauses, and wait for it: a daemon thread still
        dropping tensors when the interpreter shuts down aborts the process."""
        self.hurry.set()
        self.thread.join()


def free_later(replaced: list[dict[Any, Any]]) -> Freeing:
    """Drop ``replaced`` (copies of optimizers' old per-parameter states) on a thread, one
    parameter's tensors at a time: giving GBs back to the kernel takes it tens of
    milliseconds, which a resume need not wait for; the GIL is let go between parameters."""
    hurry = threading.Event()

    def drop() -> None:
        while replaced:
            state = replaced.pop()
            while state:
                state.popitem()  # frees under the GIL (munmap): a few ms per parameter
                hurry.wait(0.002)  # lets the resume's own Python run in between

    thread = threading.Thread(target=drop, name="ckpt-free-replaced", daemon=True)
    thread.start()
    return Freeing(thread, hurry)


def load_full(where: str, state: Mapping[str, Any], models: Mapping[str, nn.Module],
              optims: Mapping[str, tuple[torch.optim.Optimizer, str]]) -> Freeing:
    """Load an unsharded checkpoint into any model, sharded or not (every shape and every
    optimizer's parameter names are checked before anything is loaded). Returns the thread
    that frees the optimizer state it replaced: finish it before the run ends."""
    for name, m in models.items():
        check_shapes(name, {k: v.shape for k, v in state["model"][name].items()},
                     state_shapes(m), where)
    for name, (o, owner) in optims.items():
        check_optimizer_names(models[owner], o, state["optim"][name])
    # whole tensors are resharded into a sharded model; an unsharded one takes them as
    # they are (DCP's "full" path needs a tensor state to find the device: SGD has none)
    for name, m in models.items():
        load_model_state(m, state["model"][name], full=is_sharded(m))
    replaced = [held_state(o) for o, _ in optims.values()]  # not freed in this thread
    for name, (o, owner) in optims.items():
        load_optimizer_state(models[owner], o, state["optim"][name],
                             full=is_sharded(models[owner]))
    return free_later(replaced)
