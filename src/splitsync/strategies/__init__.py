"""The strategy seam: how a module is wrapped, and everything that differs because of it.

Each strategy lives in its own small module that exposes ``STRATEGY``, an instance of
:class:`Strategy` (see :mod:`splitsync.strategies.base` for what a strategy decides).
Modules are imported only when their strategy is used or looked for. Adding one is a new
module here plus its line in ``_MODULES``.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from torch import nn

from splitsync.strategies.base import Strategy, SyncSetter, WrapContext
from splitsync.strategies.modules import unwrap

__all__ = ["Strategy", "SyncSetter", "WrapContext", "STRATEGY_NAMES", "resolve",
           "get_strategy", "for_model", "mark", "unwrap", "taking", "check_name",
           "known_options", "check_options", "nearest"]

# Name -> module. The order is also the order in which for_model() asks "is this yours?":
# a more specific wrapper (HSDP is an FSDP module too) goes before the general one.
_MODULES: Mapping[str, str] = {
    "single": "splitsync.strategies.single",
    "ddp": "splitsync.strategies.ddp",
    "tp": "splitsync.strategies.tp",
    "hsdp": "splitsync.strategies.hsdp",
    "fsdp": "splitsync.strategies.fsdp",
    "dp": "splitsync.strategies.dp",
}
STRATEGY_NAMES: tuple[str, ...] = ("auto", *_MODULES)
#: Strategies that init(mesh=...) chooses (named alone they are refused)
_BY_MESH = frozenset({"tp"})
#: Set on the module ``run.model`` returns: the name of the strategy that made it.
_MARK = "_splitsync_strategy"


def check_name(name: object) -> str:
    """``name`` if it names a strategy ("auto" included); else the one unknown-strategy error."""
    if not isinstance(name, str) or name not in STRATEGY_NAMES:
        close = nearest(name, STRATEGY_NAMES) if isinstance(name, str) else None
        hint = f" Did you mean {close!r}?" if close else ""
        raise ValueError(
            f"Unknown strategy {name!r}. Valid strategies: {', '.join(STRATEGY_NAMES)}.{hint}"
        )
    return name


def resolve(name: str, world_size: int) -> str:
    """Turn "auto" into a concrete strategy for ``world_size`` (``name`` was checked by
    :func:`check_name` where it was given: ``RunConfig``, or ``run.model``)."""
    if name == "auto":
        return "ddp" if world_size > 1 else "single"
    return name


def get_strategy(name: str) -> Strategy:
    """Import and return the strategy called ``name`` (already resolved)."""
    if name not in _MODULES:
        check_name(name)  # raises for an unknown name; "auto" must be resolved first
        raise ValueError("get_strategy('auto'): resolve the name for the world size first.")
    strategy: Strategy = importlib.import_module(_MODULES[name]).STRATEGY
    return strategy


def taking(option: str) -> list[str]:
    """Names of the strategies whose ``run.model`` options include ``option`` (those a
    script can name: "tp" comes with ``init(mesh=...)``, never by name alone)."""
    return [name for name in _MODULES if name not in _BY_MESH
            and option in get_strategy(name).options]


def known_options(name: str) -> tuple[str, ...]:
    """The keyword options strategy ``name`` takes. "auto" takes DDP's: they are ignored
    at one process (so a script runs unchanged at every world size) but still known, so a
    misspelt one is refused at every world size. ``name`` is checked already."""
    if name == "auto":
        return tuple(dict.fromkeys((*get_strategy("single").options,
                                    *get_strategy("ddp").options)))
    return get_strategy(name).options


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The valid name closest to a misspelt ``word`` (None when nothing is close)."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def check_options(requested: str, resolved: str, options: Mapping[str, Any], *, where: str,
                  parameters: Iterable[str] = ()) -> None:
    """Refuse a keyword that is neither one of ``where``'s own ``parameters`` nor an option
    of the strategy ``requested`` ("auto" knows DDP's at every world size), naming the
    nearest valid keyword ("did you mean `precision`?") and the strategies that take it."""
    known = known_options(requested)
    unknown = [k for k in options if k not in known]
    if not unknown:
        return
    strat = get_strategy(resolved)
    parameters = tuple(parameters)
    hints = []
    close = nearest(unknown[0], (*parameters, *known))
    if close is not None:
        hints.append(f"Did you mean `{close}`?")
    for key in unknown:
        others = taking(key)
        if others:
            names = " or ".join(repr(o) for o in others)
            hints.append(f"{key}= is an option of strategy {names}: pass strategy="
                         f"{others[-1]!r} (or init(strategy=...)) to use it.")
    if "offload" in unknown and not strat.replaces_parameters:
        hints.append(f"{strat.name!r} keeps a whole replica on each device, so it has no "
                     "shards to offload to the host.")
    takes = list(strat.options) or "no options"
    if requested == "auto" and resolved == "single":
        takes = f"no options (DDP's are accepted and ignored at one process: {list(known)})"
    own = f" {where}'s own keywords are {', '.join(parameters)}." if parameters else ""
    raise TypeError(f"{where} got an unexpected keyword: strategy {strat.name!r} does not "
                    f"take {unknown}; it takes {takes}. " + " ".join(hints) + own)


def mark(model: nn.Module, strategy: Strategy) -> None:
    """Record on ``model`` (what ``run.model`` returns) the strategy that made it, so that
    :func:`for_model` names it without asking every strategy (and importing each)."""
    object.__setattr__(model, _MARK, strategy.name)  # not a submodule or parameter


def for_model(model: nn.Module) -> Strategy:
    """The strategy whose wrapper ``model`` is (looking through ``torch.compile``).

    A module ``run.model`` made carries its strategy's name (:func:`mark`). Otherwise each
    strategy is asked whether ``model`` is its wrapper; a model none claims is a plain module
    ("single"), unless its parameters are DTensors (sharded by hand): its state is then read
    and written like FSDP's.
    """
    # the instance's own dict: a compiled wrapper forwards attribute reads to its module
    name = vars(model).get(_MARK)
    if isinstance(name, str) and name in _MODULES:
        return get_strategy(name)
    inner = getattr(model, "_orig_mod", None)
    target = inner if isinstance(inner, nn.Module) else model
    for name in _MODULES:
        strategy = get_strategy(name)
        if strategy.owns(target):
            return strategy
    from splitsync.strategies.state import has_dtensor_params

    return get_strategy("fsdp" if has_dtensor_params(target) else "single")
