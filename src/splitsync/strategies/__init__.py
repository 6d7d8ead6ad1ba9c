"""The strategy seam: how a module is wrapped for data-parallel training.

Each strategy lives in its own small module that exposes ``STRATEGY``, a frozen
:class:`Strategy`. Modules are imported only when their strategy is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["Strategy", "WrapContext", "STRATEGY_NAMES", "resolve", "get_strategy", "unwrap"]

_MODULES: Mapping[str, str] = {
    "single": "splitsync.strategies.single",
    "ddp": "splitsync.strategies.ddp",
    "fsdp": "splitsync.strategies.fsdp",
    "dp": "splitsync.strategies.dp",
}
STRATEGY_NAMES: tuple[str, ...] = ("auto", *_MODULES)


@dataclass(frozen=True)
class WrapContext:
    """What a strategy needs to know about the run to wrap a module."""

    device: torch.device
    world_size: int
    rank: int = 0
    precision: str = "32"


def _no_sync(model: nn.Module) -> AbstractContextManager[None]:
    return nullcontext()


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under any number of DDP/DP/compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


@dataclass(frozen=True)
class Strategy:
    """A named way to wrap a module; ``no_sync`` skips gradient sync for accumulation."""

    name: str
    wrap: Callable[[nn.Module, WrapContext, Mapping[str, Any]], nn.Module]
    no_sync: Callable[[nn.Module], AbstractContextManager[None]] = field(default=_no_sync)
    options: tuple[str, ...] = ()  # keyword options this strategy accepts


def resolve(name: str, world_size: int) -> str:
    """Validate a strategy name and turn "auto" into a concrete one."""
    if not isinstance(name, str) or name not in STRATEGY_NAMES:
        raise ValueError(
            f"Unknown strategy {name!r}. Valid strategies: {', '.join(STRATEGY_NAMES)}."
        )
    if name == "auto":
        return "ddp" if world_size > 1 else "single"
    return name


def get_strategy(name: str) -> Strategy:
    """Import and return the strategy called ``name`` (already resolved)."""
    if name not in _MODULES:
        raise ValueError(
            f"Unknown strategy {name!r}. Valid strategies: {', '.join(STRATEGY_NAMES)}."
        )
    return importlib.import_module(_MODULES[name]).STRATEGY
