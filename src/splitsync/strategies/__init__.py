"""The strategy seam: how a module is wrapped, and everything that differs because of it.

Each strategy lives in its own small module that exposes ``STRATEGY``, an instance of
:class:`Strategy` (see :mod:`splitsync.strategies.base` for what a strategy decides).
Modules are imported only when their strategy is used or looked for. Adding one is a new
module here plus its line in ``_MODULES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from torch import nn

from splitsync.strategies.base import Strategy, SyncSetter, WrapContext
from splitsync.strategies.modules import unwrap

__all__ = ["Strategy", "SyncSetter", "WrapContext", "STRATEGY_NAMES", "resolve",
           "get_strategy", "for_model", "unwrap", "taking"]

# Name -> module. The order is also the order in which for_model() asks "is this yours?":
# a more specific wrapper (HSDP is an FSDP module too) goes before the general one.
_MODULES: Mapping[str, str] = {
    "single": "splitsync.strategies.single",
    "ddp": "splitsync.strategies.ddp",
    "hsdp": "splitsync.strategies.hsdp",
    "fsdp": "splitsync.strategies.fsdp",
    "dp": "splitsync.strategies.dp",
}
STRATEGY_NAMES: tuple[str, ...] = ("auto", *_MODULES)


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
    strategy: Strategy = importlib.import_module(_MODULES[name]).STRATEGY
    return strategy


def taking(option: str) -> list[str]:
    """Names of the strategies whose ``run.model`` options include ``option``."""
    return [name for name in _MODULES if option in get_strategy(name).options]


def for_model(model: nn.Module) -> Strategy:
    """The strategy whose wrapper ``model`` is (looking through ``torch.compile``).

    A model no strategy claims is a plain module ("single"), unless its parameters are
    DTensors (sharded by hand): its state is then read and written like FSDP's.
    """
    inner = getattr(model, "_orig_mod", None)
    target = inner if isinstance(inner, nn.Module) else model
    for name in _MODULES:
        strategy = get_strategy(name)
        if strategy.owns(target):
            return strategy
    from splitsync.strategies.state import has_dtensor_params

    return get_strategy("fsdp" if has_dtensor_params(target) else "single")
