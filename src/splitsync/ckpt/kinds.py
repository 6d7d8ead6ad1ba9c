"""What a saved object is: its class name and its kind (model, optimizer, scheduler, ...).

A save records both in the manifest (``types`` and ``kinds``) so that ``splitsync ckpt
inspect`` can say what a checkpoint holds without importing the user's code. Manifests
written before these keys existed are classified from the saved state's keys instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import nn

__all__ = ["KINDS", "type_name", "kind_of", "kind_from_state", "described"]

# The order inspect lists them in.
KINDS = ("model", "optimizer", "scheduler", "scaler", "ema", "object")

# Words in the class names of exponential / stochastic weight averages (torch's
# AveragedModel, timm's ModelEmaV3, ExponentialMovingAverage, ...) or in the names they are
# registered under (``ema=``); whole words, so "schema" is no EMA.
_EMA_WORDS = {"ema", "swa", "averaged"}
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


def _words(name: str) -> set[str]:
    """``ModelEmaV2`` -> {"model", "ema", "v2"}; ``ema_model`` -> {"ema", "model"}."""
    leaf = name.rsplit(".", 1)[-1]
    return {w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", leaf)}


def _looks_ema(name: str) -> bool:
    words = _words(name)
    return bool(words & _EMA_WORDS) or {"moving", "average"} <= words


def kind_of(obj: Any, name: str = "") -> str:
    """One of :data:`KINDS` for a live object registered with ``run.resume`` (as ``name``)."""
    import torch

    if _looks_ema(type_name(obj)) or (_looks_ema(name) and not isinstance(
            obj, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler))):
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
    if _looks_ema(name) or "shadow" in keys:
        return "ema"
    return "object"


def described(models: Mapping[str, nn.Module], optims: Mapping[str, tuple[Any, str]],
              others: Mapping[str, Any]) -> dict[str, Any]:
    """Manifest keys saying which strategy wrapped each model and what each saved object is
    (``strategies``, ``types``, ``kinds``): ``splitsync ckpt inspect`` reads checkpoints
    without the user's code."""
    from splitsync.strategies import for_model

    objs = {**models, **{n: o for n, (o, _) in optims.items()}, **others}
    return {"strategies": {n: for_model(m).name for n, m in sorted(models.items())},
            "types": {n: type_name(o) for n, o in sorted(objs.items())},
            "kinds": {n: kind_of(o, n) for n, o in sorted(objs.items())}}
