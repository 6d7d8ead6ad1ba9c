"""The Run's training verbs: ``run.backward``, ``run.step``, ``run.autocast``,
``run.accumulate``, ``run.no_sync``, ``run.sync_gradients``, ``run.scaler`` and ``run.join``.

:class:`TrainingVerbs` is a mixin over the run's :class:`Training` part, which chooses the
functions the verbs call: the :class:`~splitsync.run.step.StepPlan`'s (``run/step.py``: the
mechanics of backward, step and the accumulation window) with the observers that watch them
around. ``run.backward`` and ``run.step`` are the hot path: each is one attribute lookup and
the function chosen when the run started (or its observers changed).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import torch
from torch import nn

from splitsync.observe import Observer, backward_calls, chain_around, overriding, step_end_calls
from splitsync.run import forward
from splitsync.run.counting import observed_count
from splitsync.run.data import Loaders
from splitsync.run.result import StepResult
from splitsync.run.step import StepPlan
from splitsync.run.tolerance import PLAIN, Tolerance

__all__ = ["TrainingVerbs", "Training", "StepResult"]


class TrainingVerbs:
    """The Run's training verbs (a mixin: the Run owns ``_training``)."""

    _training: Training
    _tolerance: Tolerance

    def backward(self, loss: torch.Tensor, count: Any = None) -> None:
        """``loss.backward()``, scaled under "16-mixed" and divided by ``accumulate``.

        ``count=n``: ``loss`` is the mean over ``n`` items (tokens, samples; an int or a
        tensor); the optimizer step then uses the mean over every item of the step on
        every rank, as one process on the global batch would (docs/token-losses.md).
        Give it on every backward of a step or on none; ``n == 0`` contributes nothing.
        Under ``fault_tolerance="torchft"``, ``count=`` is refused (torchft reduces the
        gradients itself)."""
        if count is None:
            self._training.backward(loss)
        else:
            self._tolerance.backward(count)
            self._training.backward_count(loss, count)

    def step(self, optimizer: torch.optim.Optimizer, clip: float | None = None) -> StepResult:
        """``run.step(optimizer, clip=None)``: step the optimizer (every ``accumulate``-th
        call), then zero its gradients. Returns a :class:`~splitsync.run.result.StepResult`.

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

        Under ``fault_tolerance="torchft"`` the optimizer steps only when the step commits,
        and the result is a :class:`~splitsync.ft.steps.StepOutcome` (truthy then).
        """
        training = self._training  # a known optimizer: one dict lookup, then its step
        if self._tolerance is PLAIN:
            return training.steps.get(optimizer, training.first_step)(optimizer, clip)
        return self._tolerance.step(optimizer, clip, lambda o, c: training.steps.get(
            o, training.first_step)(o, c))

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


_BACKWARD_OP = "backward (gradient all-reduce)"


class Training:
    """backward/step and friends, over one StepPlan."""

    def __init__(self, plan: StepPlan, loaders: Loaders, world_size: int,
                 check_optimizer: Callable[[Any], None] | None = None,
                 count_sum: Callable[[float], float] = float) -> None:
        self.plan = plan
        self.loaders = loaders
        self.world_size = world_size
        self.backward: Callable[[torch.Tensor], None] = plan.backward
        # run.backward(loss, count=n): arms the plan's counted windows on first use
        self.backward_count: Callable[[torch.Tensor, Any], None] = self._first_count
        self._sum = count_sum  # the count all-reduce, where a reduction cannot carry it
        self._observers: tuple[Observer, ...] = ()
        self.step: Callable[..., StepResult] = plan.step
        # optimizer -> its step function, filled at its first run.step (after the check);
        # Run.step looks the optimizer up here, so a checked one costs one dict lookup
        self.steps: dict[Any, Callable[..., StepResult]] = {}
        self._check = check_optimizer

    def first_step(self, optimizer: torch.optim.Optimizer,
                   clip: float | None = None) -> StepResult:
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

    def _first_count(self, loss: torch.Tensor, count: Any) -> None:
        self._arm()
        self.backward_count(loss, count)

    def _arm(self) -> None:
        self.plan.arm(self.world_size, self._sum)
        self.set_observers(self._observers)  # the plan's functions changed: choose again

    # --- the open window, as a checkpoint keeps it (ckpt.save.Window) --------------------
    @property
    def every(self) -> int:
        return self.plan.every

    @property
    def window(self) -> int:
        return self.plan.window

    def open_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.plan.open_state()

    def reopen(self, done: int, shared: Mapping[str, Any] | None = None,
               own: Mapping[str, Any] | None = None) -> None:
        """Continue a saved window; a counted one arms count= (its next backward must
        have it too, as in the run that saved it)."""
        if shared and shared.get("counted") and self.plan.counting is None:
            self._arm()
        self.plan.reopen(done, shared, own)

    def set_observers(self, observers: Sequence[Observer]) -> None:
        """Choose backward/step for these observers (the plain ones when none listens)."""
        self._observers = tuple(observers)
        before = overriding(observers, "on_backward")
        around = chain_around(observers) if self.world_size > 1 else None
        self.backward = self._observed_backward(before, around)
        if self.plan.counting is not None:
            self.backward_count = observed_count(
                self.plan, self.loaders, backward_calls(observers),
                None if around is None else partial(around, _BACKWARD_OP))
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
                       end: tuple[Callable[..., Any], ...]) -> Callable[..., StepResult]:
        plan = self.plan
        if not begin and not end:
            return plan.step
        if not begin and len(end) == 1:  # one watcher after the step (the usual case):
            after = end[0]  # the least Python around the plain step

            def step_then(optimizer: torch.optim.Optimizer,
                          clip: float | None = None) -> StepResult:
                result = plan.step(optimizer, clip)
                after(optimizer, result.norm, result.stepped)  # may end the script (SystemExit)
                return result

            return step_then

        # observers see a counted window's gradients divided by its items
        settle = plan.settle if begin and plan.counting is not None else None

        def step(optimizer: torch.optim.Optimizer, clip: float | None = None) -> StepResult:
            if settle is not None:
                settle(optimizer)
            for obs in begin:
                obs.on_step_begin(optimizer)
            result = plan.step(optimizer, clip)
            for call in end:
                call(optimizer, result.norm, result.stepped)  # may end the script (SystemExit)
            return result

        return step

    def epochs_ended(self) -> None:
        """``run.epochs`` ran out with a window still open (its last batch was not known to
        be the run's last: a stream read with ``at_end="uneven"``): said, never dropped
        silently."""
        held = self.plan.window
        if held:
            warnings.warn(
                f"run.epochs() ended with {held} micro-batch(es) of an accumulation window "
                f"of {self.plan.every} not stepped, so their samples were not trained: "
                "their loader could not tell its last batch in advance (a stream with "
                "at_end='uneven'). Read the stream with at_end='stop' (the default), whose "
                "last batch is known, or make the micro-batches a multiple of accumulate.",
                RuntimeWarning, stacklevel=3)

    def autocast(self) -> AbstractContextManager[Any]:
        return self.plan.precision.autocast()

    def accumulate(self, model: nn.Module) -> AbstractContextManager[None]:
        return forward.accumulate(self.plan, model)

    def no_sync(self, model: nn.Module, enabled: bool = True) -> AbstractContextManager[None]:
        return forward.no_sync(self.plan, model, enabled)

    @property
    def sync_gradients(self) -> bool:
        return self.plan.window == 0 or self.plan.ends()

    @property
    def scaler(self) -> Any:
        return self.plan.scaler

    @staticmethod
    def join(*models: nn.Module, enable: bool = True,
             throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
        return forward.join(*models, enable=enable,
                            throw_on_early_termination=throw_on_early_termination)
