"""The Run's training verbs: ``run.backward``, ``run.step``, ``run.autocast``,
``run.accumulate``, ``run.no_sync``, ``run.sync_gradients``, ``run.scaler`` and ``run.join``.

A mixin over the run's :class:`~splitsync.run.step.Training` part (``run/step.py`` holds the
mechanics: the plan chosen once, the observed step). ``run.backward`` and ``run.step`` are the
hot path: each is one attribute lookup and the function chosen when the run started.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from splitsync.run.step import StepResult, Training

__all__ = ["TrainingVerbs", "StepResult"]


class TrainingVerbs:
    """The Run's training verbs (a mixin: the Run owns ``_training``)."""

    _training: Training

    def backward(self, loss: torch.Tensor, count: Any = None) -> None:
        """``loss.backward()``, scaled under "16-mixed" and divided by ``accumulate``.

        ``count=n``: ``loss`` is the mean over ``n`` items (tokens, samples; an int or a
        tensor); the optimizer step then uses the mean over every item of the step on
        every rank, as one process on the global batch would (docs/token-losses.md).
        Give it on every backward of a step or on none; ``n == 0`` contributes nothing."""
        if count is None:
            self._training.backward(loss)
        else:
            self._training.backward_count(loss, count)

    def step(self, optimizer: torch.optim.Optimizer, clip: float | None = None) -> StepResult:
        """``run.step(optimizer, clip=None)``: step the optimizer (every ``accumulate``-th
        call), then zero its gradients. Returns a :class:`~splitsync.run.step.StepResult`.

        Parameters, in this order: ``optimizer``, the optimizer to step (first, and the only
        one required); ``clip``, a maximum global gradient norm (best given by keyword:
        ``run.step(opt, clip=1.0)``). With ``clip`` the step does, in order: unscale the
        gradients (under "16-mixed"), clip them to ``clip`` over all ranks and shards, step,
        zero the gradients.

        The result says what happened: ``result.stepped`` is False on an accumulation
        micro-step and on a step the GradScaler skipped (inf/nan gradients), so a learning
        rate scheduler steps with ``if result.stepped: scheduler.step()`` (the result is also
        true in a condition exactly then); ``result.norm`` is the norm before clipping (None
        without ``clip`` and when the optimizer did not reach it); ``float(result)`` is the
        norm. The first call per optimizer raises :class:`splitsync.StaleOptimizerError` if
        it holds parameters ``run.model`` replaced (e.g. built before an FSDP ``run.model``).
        """
        training = self._training  # a known optimizer: one dict lookup, then its step
        return training.steps.get(optimizer, training.first_step)(optimizer, clip)

    def autocast(self) -> AbstractContextManager[Any]:
        """The precision's autocast context (models from ``run.model`` already use it)."""
        return self._training.autocast()

    def accumulate(self, model: nn.Module) -> AbstractContextManager[None]:
        """Around one micro-step (forward and backward): no gradient sync unless it is the
        ``accumulate``-th. Models from ``run.model`` decide this by themselves."""
        return self._training.accumulate(model)

    def no_sync(self, model: nn.Module, enabled: bool = True) -> AbstractContextManager[None]:
        """No gradient sync of ``model`` for the forwards and backwards inside the block
        (``enabled=False``: an ordinary block), whatever ``init(accumulate=...)`` decides:
        Fabric's ``no_backward_sync``, DDP's ``model.no_sync()``, for every strategy.
        Gradients then differ between ranks until a backward outside a block syncs them:
        call :meth:`step` only after one."""
        return self._training.no_sync(model, enabled)

    @property
    def sync_gradients(self) -> bool:
        """Whether the last :meth:`backward` completed an accumulation window, so that the
        next :meth:`step` steps the optimizer (always True without ``accumulate``): the
        place for work once per optimizer step, as Accelerate's ``sync_gradients``."""
        return self._training.sync_gradients

    @property
    def scaler(self) -> Any:
        """The GradScaler under "16-mixed" (for checkpoints), else None."""
        return self._training.scaler

    def join(self, *models: nn.Module, enable: bool = True,
             throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
        """Uneven inputs: ranks that run out of batches keep shadowing the others' all-reduces
        (``torch.distributed.algorithms.Join``) so that nobody hangs."""
        return self._training.join(*models, enable=enable,
                                   throw_on_early_termination=throw_on_early_termination)
