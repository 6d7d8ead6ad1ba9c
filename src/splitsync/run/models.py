"""The run's model part: move, wrap for the strategy, compile, install precision/accumulation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import nn

from splitsync.observe import Observer, overriding
from splitsync.run.forward import install_forward, prepare_module
from splitsync.run.step import StepPlan
from splitsync.strategies import (
    Strategy,
    WrapContext,
    check_name,
    check_options,
    for_model,
    get_strategy,
    mark,
    resolve,
)
from splitsync.train.actckpt import apply_activation_checkpointing
from splitsync.train.stale import RetiredParameters
from splitsync.train.syncbn import convert_sync_batchnorm

__all__ = ["Models", "Wrapped", "MODEL_KEYWORDS"]

# run.model's own keywords: a misspelt one is matched against these and the strategy's options
MODEL_KEYWORDS = ("strategy", "sync_batchnorm", "compile", "autocast", "activation_checkpointing")


@dataclass(frozen=True)
class Wrapped:
    """How ``run.model`` made one model: what a copy laid out like it (run.ema) needs."""

    strategy: Strategy
    ctx: WrapContext
    options: Mapping[str, Any]
    template: nn.Module | None  # the strategy's template, taken just before wrapping
    autocast: bool
    template_error: str = ""  # why no template could be taken (raised when one is needed)


class Models:
    """Wraps the user's modules and remembers which strategy wrapped each."""

    def __init__(self, device: torch.device, world_size: int, rank: int, plan: StepPlan,
                 default_strategy: str, strategy_options: Mapping[str, Any],
                 local_world_size: int | None = None, *, resolved: str, mesh: Any = None,
                 mesh_shape: Any = None) -> None:
        self.device = device
        self.world_size = world_size
        self.rank = rank
        self.local_world_size = local_world_size
        self.mesh = mesh  # init(mesh=...)'s DeviceMesh, and its sizes (also at one process)
        self.mesh_shape = mesh_shape
        self.plan = plan
        self.default_strategy = default_strategy  # init(strategy=...), "auto" kept
        self.resolved = resolved  # what init resolved it to, once (strategies.resolve)
        self.strategy_options = dict(strategy_options)
        self._strategies: WeakKeyDictionary[nn.Module, Strategy] = WeakKeyDictionary()
        self._made: WeakKeyDictionary[nn.Module, Wrapped] = WeakKeyDictionary()
        self._on_model: tuple[Observer, ...] = ()
        self._on_wrapped: tuple[Observer, ...] = ()
        self.retired = RetiredParameters()  # what run.step checks each optimizer against

    def set_observers(self, observers: Sequence[Observer]) -> None:
        self._on_model = overriding(observers, "on_model")
        self._on_wrapped = overriding(observers, "on_wrapped")

    def wrap(self, module: nn.Module, strategy: str | None, *, sync_batchnorm: bool,
             compile: bool | dict[str, Any], autocast: bool, options: Mapping[str, Any],
             activation_checkpointing: Any = None) -> nn.Module:
        """See ``Run.model``."""
        if self.mesh_shape is not None and strategy not in (None, "auto", "tp"):
            raise ValueError(f"run.model(strategy={strategy!r}) under init(mesh=...): the mesh "
                             "lays the model out (tensor-parallel over tp, FSDP2 over the "
                             "data-parallel dims); drop strategy=.")
        if self.mesh_shape is not None:
            strategy = None  # init's: "tp"
        elif "tp_plan" in options:
            raise ValueError("run.model(m, tp_plan=...) splits the model over the mesh's tp "
                             "dimension: pass init(mesh={'dp_shard': -1, 'tp': 2}) (your "
                             "sizes) to splitsync.init.")
        if strategy is None:  # init's strategy, resolved by init
            requested, name = self.default_strategy, self.resolved
        else:  # run.model's own: checked and resolved here, once
            requested, name = check_name(strategy), resolve(strategy, self.world_size)
        # checked against the strategy asked for, so a typo fails at every world size
        check_options(requested, name, options, where="run.model()", parameters=MODEL_KEYWORDS)
        strat = get_strategy(name)
        options = _ignored_when_single(requested, name, options)
        options = {**self.strategy_options, **options}
        before = list(module.parameters())  # what an optimizer built already holds
        if sync_batchnorm and self.world_size > 1:
            module = convert_sync_batchnorm(module, self.device)
        if not strat.places(options):
            module = module.to(self.device)
        for obs in self._on_model:
            obs.on_model(module)
        module = prepare_module(module, self.plan.precision)  # before buckets or shards
        # Before wrapping: FSDP's hooks then sit outside the recomputed region.
        apply_activation_checkpointing(module, activation_checkpointing,
                                       lambda: strat.blocks(module, options))
        ctx = WrapContext(self.device, self.world_size, self.rank, self.plan.precision,
                          self.local_world_size, self.mesh, self.mesh_shape)
        template, error = _template(strat, module)  # FSDP2 modules cannot be copied later
        wrapped = strat.wrap(module, ctx, options)
        if compile:
            wrapped = strat.compile(wrapped, {} if compile is True else dict(compile))
        wrapped = install_forward(self.plan, wrapped, autocast, strat)
        for obs in self._on_wrapped:
            wrapped = obs.on_wrapped(wrapped)
        self._strategies[wrapped] = strat
        mark(wrapped, strat)
        self._made[wrapped] = Wrapped(strat, ctx, options, template, autocast, error)
        self.retired.record(before, wrapped, _why(strat, self.plan))
        return wrapped

    def all(self) -> list[nn.Module]:
        """The models ``run.model`` returned that are still alive, in the order it made them."""
        return list(self._made)

    def made(self, model: nn.Module) -> Wrapped | None:
        """How ``run.model`` made ``model``; None if it did not return it."""
        return self._made.get(model)

    def strategy_of(self, model: nn.Module) -> Strategy:
        """The strategy that wrapped ``model`` (found by its type if run.model did not)."""
        return self._strategies.get(model) or for_model(model)


def _template(strat: Strategy, module: nn.Module) -> tuple[nn.Module | None, str]:
    try:
        return strat.template(module), ""
    except Exception as exc:  # only run.ema needs it; it reports this if it is called
        return None, f"{type(exc).__name__}: {exc}"


def _why(strat: Strategy, plan: StepPlan) -> str:
    if strat.replaces_parameters:
        return (f"strategy {strat.name!r} replaced the module's parameters with new (sharded) "
                "ones when run.model wrapped it")
    dtype = plan.precision.param_dtype
    cast = f", casting to {dtype}" if dtype is not None else ""
    return f"run.model made new parameter objects (moving to the device{cast})"


def _ignored_when_single(requested: str, resolved: str, options: Mapping[str, Any]
                         ) -> Mapping[str, Any]:
    """DDP's options under "auto" at one process: accepted and ignored, so that a script
    runs unchanged at every world size. An explicit "single" still rejects them."""
    if requested != "auto" or resolved != "single" or not options:
        return options
    ddp = get_strategy("ddp").options
    return {k: v for k, v in options.items() if k not in ddp}
