"""Run methods for the optimisation step: precision, accumulation, clipping, uneven inputs."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from splitsync.join import join

if TYPE_CHECKING:
    from splitsync.accumulate import StepPlan
    from splitsync.data import DeviceLoader
    from splitsync.guards.hangs import Watch
    from splitsync.verify.record import ScriptRecorder

__all__ = ["TrainingMethods"]


class TrainingMethods:
    """backward/step and friends; the per-step hot path, decided once by a StepPlan."""

    world_size: int
    _plan: StepPlan
    _watch: Watch | None
    _verify: ScriptRecorder | None
    _active: DeviceLoader | None

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled under "16-mixed" and divided by ``accumulate``."""
        if self._verify is not None:
            self._verify.on_backward(loss, self._active)
        if self._watch is not None and self.world_size > 1:
            self._watch.call("backward (gradient all-reduce)", self._plan.backward, loss)
        else:
            self._plan.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer,
             clip: float | None = None) -> torch.Tensor | None:
        """Step the optimizer, then zero its gradients (set to None).

        With ``accumulate=k`` only every k-th call steps (the others return at once).
        ``clip`` clips gradients to that global norm first (unscaled under "16-mixed") and
        the norm before clipping is returned; without ``clip`` the result is None.
        """
        if self._verify is None:
            return self._plan.step(optimizer, clip)
        self._verify.on_step_begin()
        norm = self._plan.step(optimizer, clip)
        self._verify.on_step_end()  # may end the script once enough steps are recorded
        return norm

    def autocast(self) -> AbstractContextManager[Any]:
        """The precision's autocast context (models from ``run.model`` already use it)."""
        return self._plan.precision.autocast()

    def accumulate(self, model: nn.Module) -> AbstractContextManager[None]:
        """Around one micro-step (forward and backward): no gradient sync unless it is the
        ``accumulate``-th. Models from ``run.model`` decide this by themselves."""
        return self._plan.accumulate(model)

    @property
    def sync_gradients(self) -> bool:
        """Whether the last backward completed an accumulation window (the step will step)."""
        return self._plan.micro % self._plan.every == 0

    @property
    def scaler(self) -> Any:
        """The GradScaler under "16-mixed" (for checkpoints), else None."""
        return self._plan.scaler

    def join(self, *models: nn.Module, enable: bool = True,
             throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
        """Uneven inputs: ranks that run out of batches keep shadowing the others' all-reduces
        (``torch.distributed.algorithms.Join``) so that nobody hangs."""
        return join(*models, enable=enable, throw_on_early_termination=throw_on_early_termination)
