"""``run.backward`` and ``run.step`` in one room: loss scaling, gradient accumulation,
clipping, the observers around them, and uneven inputs (``run.join``).

Everything is decided once (when the run starts, when a model is prepared, when the run's
observers change), never per call: precision "32" without accumulation and without
observers gets a backward that is exactly ``loss.backward()`` and a step that is exactly
``optimizer.step(); optimizer.zero_grad(set_to_none=True)``.

Accumulation over ``k`` micro-batches keeps one counter of backward calls. The wrapped
model's forward reads it to decide whether this micro-step synchronises gradients (DDP
decides that in forward: ``require_backward_grad_sync`` is what ``no_sync()`` toggles;
FSDP2 reads ``set_requires_gradient_sync`` in backward), ``backward`` divides the loss by
``k`` and ``step`` steps only on every ``k``-th micro-batch. So the ordinary loop is
correct with ``init(accumulate=k)`` alone. The counter runs across epochs: when an epoch's
batch count is not a multiple of ``k``, its last window is completed by the next epoch's
first micro-batches (every optimizer step still sees exactly ``k``). The run's last window
may hold fewer: on the last batch of the last epoch of ``run.epochs`` (``ends``, which the
run points at its loaders) that micro-step syncs and steps, its gradients scaled by
``k / held`` so they are the mean over the ``held`` micro-batches it really has, and no
sample is left untrained. A checkpoint saved inside a window keeps it (``window``,
``reopen``: the micro-steps done; the gradients themselves are saved by ``splitsync.ckpt``).

``run.backward(loss, count=n)`` (``run/counting.py``) weighs micro-batches by their items
instead; its functions are chosen only once ``count=`` is first used.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from functools import partial
from typing import Any
from weakref import WeakKeyDictionary, WeakSet

import torch
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable

from splitsync.observe import Observer, backward_calls, chain_around, overriding, step_end_calls
from splitsync.run.counting import Counting, as_count
from splitsync.run.data import Loaders
from splitsync.run.result import NOT_STEPPED, STEPPED, StepResult
from splitsync.strategies import Strategy, SyncSetter, for_model
from splitsync.train.clip import clip_optimizer
from splitsync.train.precision import Precision, forward_with

__all__ = ["StepPlan", "StepResult", "Training", "prepare_module", "join"]




def _plain_backward(loss: torch.Tensor) -> None:
    loss.backward()


class StepPlan:
    """The run's backward/step functions and its micro-step counter."""

    def __init__(self, precision: Precision, accumulate: int) -> None:
        self.precision = precision
        self.every = accumulate
        self.micro = 0  # backward calls so far; a step boundary when divisible by `every`
        self.scaler: Any = precision.make_scaler()
        self._update_due = False  # GradScaler.update() runs before the next backward
        # Whether the last step really stepped: the plain step always does; the general one
        # not inside an accumulation window, nor when the GradScaler skipped it.
        self.stepped = True
        self._watched: WeakSet[torch.optim.Optimizer] = WeakSet()
        # Whether the micro-batch under way is the run's last (its window then ends there)
        self.ends: Callable[[], bool] = _never
        # count=: armed by the first counted backward; the models it must know of
        self.counting: Counting | None = None
        self._models: WeakKeyDictionary[nn.Module, Strategy] = WeakKeyDictionary()
        self.backward: Callable[[torch.Tensor], None]
        self.step: Callable[..., StepResult]
        self.held = 0  # run.no_sync blocks open: no micro-step inside one syncs
        self._choose()

    def _choose(self) -> None:
        if self.counting is not None and self.counting.unit_window and self.scaler is None:
            # one process, no accumulation: a window is one backward, nothing to rescale
            self.backward = partial(self.counting.unit_backward, self)
            self.step = partial(self.counting.unit_step, self)
        elif self.counting is not None:
            self.backward = self._backward_checked
            self.step = self._step_general
        elif self.scaler is None and self.every == 1:
            self.backward = _plain_backward
            self.step = self._step_plain
        else:
            self.backward = self._backward_general
            self.step = self._step_general

    def arm(self, world_size: int, reduce: Callable[[float], float]) -> Counting:
        """Switch to counted windows (the first ``run.backward(loss, count=n)``)."""
        if self.counting is None:
            self.counting = Counting(world_size, self.every, reduce)
            for model, strategy in list(self._models.items()):
                self.counting.add(model, strategy)
            self._choose()
        return self.counting

    def use_strategy_scaler(self, strategy: Strategy, model: nn.Module) -> None:
        """The scaler the model's strategy needs (FSDP2's sharded one: found-inf must agree
        across ranks), swapped in only before the first backward."""
        if self.scaler is None or self.micro:
            return
        scaler = strategy.make_scaler(self.precision, model)
        if type(scaler) is not type(self.scaler):
            self.scaler = scaler

    @property
    def sync_now(self) -> bool:
        """Whether the coming micro-step ends an accumulation window (syncs and steps)."""
        return (self.micro + 1) % self.every == 0 or self.ends()

    # --- the open window, as a checkpoint keeps it --------------------------------------
    @property
    def window(self) -> int:
        """Micro-steps done in the open accumulation window (0: none is open)."""
        return self.micro % self.every

    def reopen(self, done: int) -> None:
        """Continue a window a checkpoint saved with ``done`` micro-steps in it (the saved
        gradients are put back by the checkpoint's loader)."""
        if not 0 <= done < self.every:
            raise ValueError(f"an accumulation window of {done} micro-step(s) does not fit "
                             f"accumulate={self.every}")
        self.micro = done

    # --- backward ----------------------------------------------------------------------
    def update_scale(self) -> Any:
        """The scaler, its deferred update done (several optimizers share one scale)."""
        scaler = self.scaler
        if scaler is not None and self._update_due:
            scaler.update()
            self._update_due = False
        return scaler

    def _backward_general(self, loss: torch.Tensor) -> None:
        scaler = self.update_scale()
        if scaler is not None:
            loss = scaler.scale(loss)
        if self.every > 1:
            loss = loss / self.every
        loss.backward()
        self.micro += 1

    def _backward_checked(self, loss: torch.Tensor) -> None:
        """A backward without count= once count= has been used: windows must not mix."""
        self.counting.begin(self.micro % self.every == 0, counted=False)  # type: ignore[union-attr]
        self._backward_general(loss)

    # --- step --------------------------------------------------------------------------
    @staticmethod
    def _step_plain(optimizer: torch.optim.Optimizer, clip: float | None = None) -> StepResult:
        if clip is None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return STEPPED
        norm = clip_optimizer(optimizer, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return StepResult(True, norm)

    def settle(self, optimizer: torch.optim.Optimizer) -> bool:
        """Before a step that ends a counted window: divide the gradients no reduction
        divided by the window's items; False when it had none anywhere (no step)."""
        counting = self.counting
        return (counting is None or (bool(self.micro % self.every) and not self.ends())
                or counting.settle(optimizer))

    def _step_general(self, optimizer: torch.optim.Optimizer,
                      clip: float | None = None) -> StepResult:
        held = self.micro % self.every
        if held:
            if not self.ends():
                self.stepped = False
                return NOT_STEPPED  # inside an accumulation window: keep gradients, do not step
            if self.counting is None:  # counted windows divide by their items anyway
                _close_window(optimizer, self.every, held)
            self.micro += self.every - held  # a later backward opens a new window
        counting = self.counting
        if counting is not None and not counting.settle(optimizer):
            optimizer.zero_grad(set_to_none=True)  # no item on any rank: nothing to learn
            self.stepped = False
            return NOT_STEPPED
        norm = None
        scaler = self.scaler
        if scaler is None:
            if clip is not None:
                norm = clip_optimizer(optimizer, clip)
            optimizer.step()
            self.stepped = True
        else:
            self._watch(optimizer)
            self.stepped = False  # set again by the optimizer's post-hook if it steps
            if clip is not None:
                scaler.unscale_(optimizer)  # clip true gradients, not scaled ones
                norm = clip_optimizer(optimizer, clip)
            scaler.step(optimizer)  # skipped when gradients hold inf/nan
            self._update_due = True
        optimizer.zero_grad(set_to_none=True)
        if norm is None:
            return STEPPED if self.stepped else NOT_STEPPED
        return StepResult(self.stepped, norm)

    def _watch(self, optimizer: torch.optim.Optimizer) -> None:
        # GradScaler.step calls optimizer.step only when the gradients are finite: a
        # post-hook is the one public signal of a step it did not skip.
        if optimizer not in self._watched:
            self._watched.add(optimizer)
            optimizer.register_step_post_hook(self._on_real_step)

    def _on_real_step(self, *_: Any) -> None:
        self.stepped = True

    # --- models ------------------------------------------------------------------------
    def install_forward(self, model: nn.Module, autocast: bool = True,
                        strategy: Strategy | None = None) -> nn.Module:
        """Give ``model`` a forward with the precision's autocast and the accumulation sync.

        The forward is replaced on the instance (keys of ``state_dict`` are unchanged); when
        neither is needed the model is returned untouched. ``autocast=False`` leaves autocast
        to the user (``run.autocast()``).
        """
        strategy = for_model(model) if strategy is None else strategy
        self.use_strategy_scaler(strategy, model)
        self._models[model] = strategy
        if self.counting is not None:
            self.counting.add(model, strategy)
        forward = model.forward
        precision = self.precision if autocast else replace(self.precision, autocast_dtype=None)
        wrapped = forward_with(forward, precision)
        setter = strategy.sync_setter(model) if self.every > 1 else None
        if setter is not None:
            wrapped = _synced(wrapped, setter, self)
        if wrapped is not forward:
            model.forward = wrapped
        return model

    def accumulate(self, model: nn.Module) -> AbstractContextManager[None]:
        """Skip gradient sync for the coming micro-step unless it ends the window."""
        if self.sync_now:
            return nullcontext()
        return for_model(model).no_sync(model)

    @contextmanager
    def no_sync(self, model: nn.Module, enabled: bool = True) -> Iterator[None]:
        """No gradient sync of ``model`` inside the block, whatever the accumulation
        window says (the forward installed for ``accumulate`` reads ``held``)."""
        if not enabled:
            yield
            return
        self.held += 1
        try:
            with for_model(model).no_sync(model):
                yield
        finally:
            self.held -= 1


def _never() -> bool:
    return False


def _close_window(optimizer: torch.optim.Optimizer, every: int, held: int) -> None:
    """The run's last window holds ``held`` < ``every`` micro-batches, each of whose losses
    was divided by ``every``: scale the gradients to their mean over ``held``."""
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(every / held)


def _synced(forward: Callable[..., Any], setter: SyncSetter,
            plan: StepPlan) -> Callable[..., Any]:
    def synced_forward(*args: Any, **kwargs: Any) -> Any:
        setter(not plan.held and plan.sync_now)
        return forward(*args, **kwargs)

    return synced_forward


def prepare_module(module: nn.Module, precision: Precision) -> nn.Module:
    """Cast parameters for "bf16-true" (before any wrapper builds buckets or shards)."""
    if precision.param_dtype is not None:
        module = module.to(precision.param_dtype)
    return module

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
        self.plan.arm(self.world_size, self._sum)
        self.set_observers(self._observers)  # the plan's functions changed: choose again
        self.backward_count(loss, count)

    def set_observers(self, observers: Sequence[Observer]) -> None:
        """Choose backward/step for these observers (the plain ones when none listens)."""
        self._observers = tuple(observers)
        before = overriding(observers, "on_backward")
        around = chain_around(observers) if self.world_size > 1 else None
        self.backward = self._observed_backward(before, around)
        if self.plan.counting is not None:
            self.backward_count = self._observed_count(backward_calls(observers), around)
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

    def _observed_count(self, calls: tuple[Callable[..., Any], ...],
                        around: Callable[..., Any] | None) -> Callable[[torch.Tensor, Any], None]:
        plan, loaders = self.plan, self.loaders
        counted = partial(plan.counting.backward, plan)  # type: ignore[union-attr]
        if not calls and around is None:  # the counting's own backward: one frame
            return counted

        def backward(loss: torch.Tensor, count: Any) -> None:
            n = as_count(count)
            for call in calls:
                call(loss, loaders.active, n)
            if around is None:
                counted(loss, n)
            else:
                around(_BACKWARD_OP, counted, loss, n)

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
        return self.plan.accumulate(model)

    def no_sync(self, model: nn.Module, enabled: bool = True) -> AbstractContextManager[None]:
        return self.plan.no_sync(model, enabled)

    @property
    def sync_gradients(self) -> bool:
        return self.plan.window == 0 or self.plan.ends()

    @property
    def scaler(self) -> Any:
        return self.plan.scaler

    @staticmethod
    def join(*models: nn.Module, enable: bool = True,
             throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
        return join(*models, enable=enable, throw_on_early_termination=throw_on_early_termination)

def join(*objects: nn.Module | Joinable, enable: bool = True,
         throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
    """``torch.distributed.algorithms.Join`` over the models' joinables (DDP) and Joinables.

    Each model's strategy says what to join: a single-process model needs nothing (a no-op
    context); FSDP has no join support in PyTorch and raises with the fix (give every rank
    the same number of batches, ``run.loader(..., drop_last=True)``).
    """
    joinables: list[Any] = []
    for obj in objects:
        if isinstance(obj, Joinable):
            joinables.append(obj)
        elif isinstance(obj, nn.Module):
            joinables.extend(for_model(obj).joinables(obj))
        else:
            raise TypeError(f"run.join() takes models (or Joinables), got {type(obj).__name__}.")
    if not joinables or not enable:
        return nullcontext()
    return Join(joinables, enable=enable, throw_on_early_termination=throw_on_early_termination)
