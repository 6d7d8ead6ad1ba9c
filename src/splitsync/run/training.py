"""The run's training part: backward/step (the per-step hot path), precision, accumulation,
clipping and uneven inputs.

The backward and step functions are chosen when the part is made and again whenever the
run's observers change, never per call: without observers ``backward`` *is* the StepPlan's
(plain ``loss.backward()`` for fp32 without accumulation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import torch
from torch import nn

from splitsync.observe import Observer, chain_around, overriding, step_end_calls
from splitsync.run.accumulate import StepPlan
from splitsync.run.data import Loaders
from splitsync.run.join import join

__all__ = ["Training"]

_BACKWARD_OP = "backward (gradient all-reduce)"


class Training:
    """backward/step and friends, over one StepPlan."""

    def __init__(self, plan: StepPlan, loaders: Loaders, world_size: int,
                 check_optimizer: Callable[[Any], None] | None = None) -> None:
        self.plan = plan
        self.loaders = loaders
        self.world_size = world_size
        self.backward: Callable[[torch.Tensor], None] = plan.backward
        self.step: Callable[..., torch.Tensor | None] = plan.step
        # optimizer -> its step function, filled at its first run.step (after the check);
        # Run.step looks the optimizer up here, so a checked one costs one dict lookup
        self.steps: dict[Any, Callable[..., torch.Tensor | None]] = {}
        self._check = check_optimizer

    def first_step(self, optimizer: torch.optim.Optimizer,
                   clip: float | None = None) -> torch.Tensor | None:
        """The first run.step of ``optimizer``: check it once, then step."""
        if not isinstance(optimizer, torch.optim.Optimizer):  # e.g. run.step(1.0, opt)
            raise TypeError(f"run.step(optimizer, clip=None) takes the optimizer first, got a "
                            f"{type(optimizer).__name__}; write run.step(opt) or "
                            "run.step(opt, clip=1.0).")
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))):
            raise TypeError(f"run.step(optimizer, clip=...) takes a maximum gradient norm "
                            f"(a number) as clip, got a {type(clip).__name__}.")
        if self._check is not None:
            self._check(optimizer)  # raises for an optimizer run.model made stale
        self.steps[optimizer] = self.step
        return self.step(optimizer, clip)

    def set_observers(self, observers: Sequence[Observer]) -> None:
        """Choose backward/step for these observers (the plain ones when none listens)."""
        before = overriding(observers, "on_backward")
        around = chain_around(observers) if self.world_size > 1 else None
        self.backward = self._observed_backward(before, around)
        self.step = self._observed_step(overriding(observers, "on_step_begin"),
                                        step_end_calls(observers))
        self.steps = dict.fromkeys(self.steps, self.step)

    def _observed_backward(self, before: tuple[Observer, ...],
                           around: Callable[..., Any] | None) -> Callable[[torch.Tensor], None]:
        plan, loaders = self.plan, self.loaders
        if not before and around is None:
            return plan.backward
        if not before:  # only watched (guards): a C-level partial, no Python frame of ours
            return partial(around, _BACKWARD_OP, plan.backward)  # type: ignore[arg-type]

        def backward(loss: torch.Tensor) -> None:
            for obs in before:
                obs.on_backward(loss, loaders.active)
            if around is None:
                plan.backward(loss)
            else:
                around(_BACKWARD_OP, plan.backward, loss)

        return backward

    def _observed_step(self, begin: tuple[Observer, ...],
                       end: tuple[Callable[..., Any], ...]) -> Callable[..., torch.Tensor | None]:
        plan = self.plan
        if not begin and not end:
            return plan.step
        if not begin and len(end) == 1:  # one watcher after the step (the usual case):
            after = end[0]  # the least Python around the plain step

            def step_then(optimizer: torch.optim.Optimizer,
                          clip: float | None = None) -> torch.Tensor | None:
                norm = plan.step(optimizer, clip)
                after(optimizer, norm, plan.stepped)  # may end the script (SystemExit)
                return norm

            return step_then

        def step(optimizer: torch.optim.Optimizer,
                 clip: float | None = None) -> torch.Tensor | None:
            for obs in begin:
                obs.on_step_begin(optimizer)
            norm = plan.step(optimizer, clip)
            if end:
                stepped = plan.stepped
                for call in end:
                    call(optimizer, norm, stepped)  # may end the script (SystemExit)
            return norm

        return step

    def autocast(self) -> AbstractContextManager[Any]:
        return self.plan.precision.autocast()

    def accumulate(self, model: nn.Module) -> AbstractContextManager[None]:
        return self.plan.accumulate(model)

    @property
    def sync_gradients(self) -> bool:
        return self.plan.micro % self.plan.every == 0

    @property
    def scaler(self) -> Any:
        return self.plan.scaler

    @staticmethod
    def join(*models: nn.Module, enable: bool = True,
             throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
        return join(*models, enable=enable, throw_on_early_termination=throw_on_early_termination)
