"""What a saved object is: its class name and its kind (model, optimizer, scheduler, ...).

A save records both in the manifest (``types`` and ``kinds``) so that ``splitsync ckpt
inspect`` can say what a checkpoint holds without importing the user's code. Manifests
written before these keys existed are classified from the saved state's keys instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

__all__ = ["KINDS", "type_name", "kind_of", "kind_from_state"]

# The order inspect lists them in.
KINDS = ("model", "optimizer", "scheduler", "scaler", "ema", "object")

# Class-name fragments of exponential / stochastic weight averages (torch's AveragedModel,
# timm's ModelEma*, splitsync's own, ...).
_EMA_HINTS = ("ema", "averaged", "movingaverage", "swa")
_WRAPPERS = ("torch.nn.parallel", "torch._dynamo")


def _first_user_class(obj: Any) -> type:
    """The object's class, skipping classes torch.distributed makes on the fly (FSDP2's
    ``FSDPLinear`` and the like subclass the user's class)."""
    for cls in type(obj).__mro__:
        if not cls.__module__.startswith("torch.distributed"):
            return cls
    return type(obj)


def _unwrapped(obj: Any) -> Any:
    """The module under DDP / DataParallel / torch.compile wrappers (not under modules that
    merely hold another, such as torch's AveragedModel: those are what was saved)."""
    while isinstance(obj, nn.Module) and type(obj).__module__.startswith(_WRAPPERS):
        inner = getattr(obj, "module", None) or getattr(obj, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        obj = inner
    return obj


def type_name(obj: Any) -> str:
    """``module.QualName`` of the object (the user's module for a wrapped model)."""
    cls = _first_user_class(_unwrapped(obj))
    return f"{cls.__module__}.{cls.__qualname__}"


def _looks_ema(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1].lower()
    return any(h in leaf for h in _EMA_HINTS)


def kind_of(obj: Any) -> str:
    """One of :data:`KINDS` for a live object registered with ``run.resume``."""
    import torch

    if _looks_ema(type_name(obj)):
        return "ema"
    if isinstance(obj, nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return "scheduler"
    if isinstance(obj, torch.amp.GradScaler):  # torch.cuda.amp's subclasses it
        return "scaler"
    return "object"


def kind_from_state(name: str, type_: str | None, state: Any) -> str:
    """The kind of a saved object known only by its name, class name (if recorded) and
    state dict: for manifests that did not record kinds."""
    if type_ and _looks_ema(type_):
        return "ema"
    if type_ and ("lr_scheduler" in type_ or type_.endswith("LR")):
        return "scheduler"
    if type_ and type_.endswith("GradScaler"):
        return "scaler"
    keys = set(state) if isinstance(state, Mapping) else set()
    if {"last_epoch", "base_lrs"} <= keys:
        return "scheduler"
    if {"scale", "growth_factor"} <= keys:
        return "scaler"
    if "ema" in name.lower() or "shadow" in keys or "averaged" in name.lower():
        return "ema"
    return "object"
