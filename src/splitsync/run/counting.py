"""``run.backward(loss, count=n)``: the mean over all items of a step, at any scale.

``loss`` is a micro-batch's mean over its ``n`` items (tokens, samples). The gradient of
the mean over every item of the optimizer step, on every rank, is
``sum(n_i * grad(mean_i)) / N`` with ``N = sum(n_i)``. So each counted backward multiplies
its loss by ``n * unit`` (no collective), and the window's gradients are divided by
``unit * N`` once: inside the gradient reduction where the strategy can
(:mod:`splitsync.strategies.count`), else by the step, before clipping and before the
observers of ``run.step`` look at the gradients.

``unit`` is a power of two, the same on every rank for a whole window, close to
``1 / (items per rank and window)`` of the window before: the gradients of a counted
backward keep the size they have without ``count=`` (a float16 loss scale does not
overflow), and scaling by a power of two changes no bit of the result, so the choice
leaves the run exact (a resumed run, which starts again at ``unit = 1``, trains the same).
In one process without accumulation the multiplier is 1 and nothing is rescaled.

A window whose items are zero on every rank updates nothing: its step is skipped (as the
GradScaler skips one, ``stepped`` is False), since the mean over no item is undefined.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol
from weakref import WeakKeyDictionary

import torch
from torch import nn

from splitsync.run.result import NOT_STEPPED, StepResult
from splitsync.strategies import Strategy
from splitsync.strategies.count import CountSync
from splitsync.train.empty import backward_zero

if TYPE_CHECKING:
    from splitsync.run.data import Loaders

__all__ = ["Counting", "as_count", "unit_for", "observed_count", "MIXED", "StepPlan"]


class StepPlan(Protocol):
    """What the counted backward and step read of ``run/step.py``'s StepPlan (named, not
    imported: the plan imports this module)."""

    micro: int
    every: int
    scaler: Any
    stepped: bool
    counting: Counting | None

    def ends(self) -> bool: ...
    def update_scale(self) -> Any: ...
    def _step_plain(self, optimizer: torch.optim.Optimizer, clip: float | None = None
                    ) -> StepResult: ...

MIXED = ("run.backward: this accumulation window mixes micro-batches with and without "
         "count=. The step divides by the items of the whole window, so give count= on every "
         "micro-batch of an optimizer step (count=0 for one without items), or on none.")


def as_count(count: Any) -> float:
    """``count=`` as a float: a number or a one-element tensor, finite and >= 0."""
    kind = type(count)
    if kind is int or kind is float:  # the usual case, without the ABC checks below
        value = float(count)
    elif isinstance(count, torch.Tensor):
        if count.numel() != 1:
            raise ValueError(f"run.backward(loss, count=...) got a tensor of shape "
                             f"{tuple(count.shape)}: give the number of items the loss is the "
                             "mean of, e.g. count=(labels != -100).sum().")
        value = float(count.item())  # a host read: on a GPU it waits for the forward
    elif isinstance(count, numbers.Real) and not isinstance(count, bool):
        value = float(count)
    else:
        raise TypeError(f"run.backward(loss, count=...) takes the number of items the loss "
                        f"is the mean of (an int or a tensor), got {type(count).__name__}.")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"run.backward(loss, count={value!r}): the count of items must be "
                         "finite and >= 0 (0 for a micro-batch without any).")
    return value


def unit_for(total: float, world_size: int) -> float:
    """The power of two nearest ``world_size / total`` (1 when ``total`` is 0)."""
    if total <= 0:
        return 1.0
    exponent = round(math.log2(total / world_size))
    return math.ldexp(1.0, -max(-60, min(60, exponent)))


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


class Counting:
    """A run's counted windows: this rank's items, the unit, the models' reductions."""

    def __init__(self, world_size: int, every: int, reduce: Callable[[float], float]) -> None:
        self.world = world_size
        self.every = every
        self.reduce = reduce  # sums a number over ranks (the run's collective)
        self.unit_window = world_size == 1 and every == 1  # the multiplier is 1, no rescale
        self.unit = 1.0
        self.counted = False  # the open window has count=
        self.local = 0.0  # this rank's items in the window
        self.total: float | None = None  # the window's items on all ranks, once known
        # the total a reduction learnt (a tensor while it is still on the device)
        self.pending: float | torch.Tensor | None = None
        self.closed = False  # the window's last backward has run
        self.empty = False  # one process, no accumulation: the last micro-batch had no item
        self.settled = False  # a run.step has ended the window
        self.skip: bool | None = None
        self.done: set[int] = set()  # ids of the optimizers the step rescaled
        self.syncs: list[CountSync] = []  # (they hold their models weakly)
        self.plain_models = False  # a model whose gradients the step rescales
        # one micro-batch per window and every reduction weighs the local gradient itself:
        # the loss is not multiplied at all (DDP packs n * gradient with the count)
        self.folds = False
        self._uncovered: WeakKeyDictionary[Any, list[nn.Parameter]] = WeakKeyDictionary()

    def add(self, model: nn.Module, strategy: Strategy) -> None:
        """A model run.model made: its reduction divides by the count, or the step does."""
        if self.world == 1:
            return
        sync = strategy.count_sync(model)
        self.syncs = [s for s in self.syncs if s.model is not None]
        if sync is None:
            self.plain_models = True
        else:
            self.syncs.append(sync)
        self.folds = (self.every == 1 and not self.plain_models
                      and all(s.weighs for s in self.syncs))
        self._uncovered = WeakKeyDictionary()

    # --- the window ----------------------------------------------------------------------
    def begin(self, first: bool, counted: bool) -> None:
        """A backward: the window's ``first`` opens it, a later one must be like it."""
        if first:
            self.open(counted)
        elif counted != self.counted:
            raise ValueError(MIXED)

    def backward(self, plan: StepPlan, loss: torch.Tensor, count: Any) -> None:
        """One counted micro-batch: ``loss`` (its mean over ``count`` items) times
        ``count * unit``. (Runs every micro-step: few calls of its own.)"""
        n = float(count) if type(count) is int and count >= 0 else as_count(count)
        if self.unit_window and plan.scaler is None:  # the micro-batch is the whole step
            self.empty = n == 0
            if n:
                loss.backward()
            else:
                backward_zero(loss)
            plan.micro += 1
            return
        micro, every = plan.micro, plan.every
        if micro % every == 0:
            self.open(True)
        elif not self.counted:
            raise ValueError(MIXED)
        # the window's last backward; the run's last window may end early (plan.ends)
        last = (micro + 1) % every == 0 or plan.ends()
        scaler = plan.scaler
        if scaler is not None:
            plan.update_scale()
        self.local += n
        folds = self.folds
        if last:
            for sync in self.syncs:
                if folds:
                    sync.before(n, 1.0, n)
                else:
                    sync.before(self.local, self.unit)
        if n == 0:
            backward_zero(loss)  # exact zeros, through every hook and collective
        else:
            if not (self.unit_window or folds):
                loss = loss * (n * self.unit)
            if scaler is not None:
                loss = scaler.scale(loss)
            loss.backward()
        plan.micro = micro + 1
        if last:
            self.after_last()

    def unit_backward(self, plan: StepPlan, loss: torch.Tensor) -> None:
        """A backward without count= in one process without accumulation."""
        self.empty = False
        loss.backward()
        plan.micro += 1

    def unit_step(self, plan: StepPlan, optimizer: torch.optim.Optimizer,
                  clip: float | None = None) -> StepResult:
        """Its step: the plain one, unless the micro-batch had no item."""
        if self.empty:
            optimizer.zero_grad(set_to_none=True)
            plan.stepped = False
            return NOT_STEPPED
        plan.stepped = True
        return plan._step_plain(optimizer, clip)

    def open(self, counted: bool) -> None:
        """A window's first backward (``counted``: with count=)."""
        if self.counted and self.closed:
            if not self.settled and self._rescales():
                raise RuntimeError(
                    "run.backward(loss, count=...) began a new accumulation window, but no "
                    "run.step(optimizer) ended the last one: under count= the step divides "
                    "the window's gradients by its items. Call run.step after every "
                    f"{self.every}-th run.backward.")
            if not (self.unit_window or self.folds):
                total = self.total if self.total is not None else self._read_pending()
                if total:
                    self.unit = unit_for(total, self.world)
        self._reset(counted)

    def _reset(self, counted: bool) -> None:
        self.counted, self.empty = counted, False
        self.local, self.total, self.pending, self.skip = 0.0, None, None, None
        self.closed = self.settled = False
        if self.done:
            self.done = set()

    def kept(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The open window as a checkpoint keeps it: that it is counted and its unit (the
        same on every rank), and this rank's items so far (``{}, {}``: not counted)."""
        if not self.counted:
            return {}, {}
        return {"counted": True, "unit": self.unit}, {"items": self.local}

    def reopen(self, shared: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        """Continue a window a checkpoint saved (:meth:`kept`; empty: no counted window)."""
        self._reset(bool(shared.get("counted", False)))
        if self.counted:
            # the power of two its first micro-steps were multiplied by: their gradients
            # and the ones still to come are divided by the same
            self.unit = float(shared["unit"])
            self.local = float(own.get("items", 0.0))

    def after_last(self) -> None:
        """After the window's last backward: the reductions divide by its items."""
        if self.world == 1:
            self.total = self.local
        for sync in self.syncs:
            found = sync.after(self._total)
            if found is not None and self.total is None:
                self.pending = found
        self.closed = True

    # --- the step ------------------------------------------------------------------------
    def settle(self, optimizer: torch.optim.Optimizer) -> bool:
        """At the step that ends a counted window: the gradients ``optimizer`` updates
        divided by the window's items; False when there were none (skip the step)."""
        if self.unit_window:
            return not self.empty
        if not self.counted:
            return True
        self.settled = True
        if self.skip is None:
            self.skip = (self.total if self.total is not None else self._total()) == 0
        if self.skip:
            return False
        if self.unit_window or id(optimizer) in self.done or (
                self.world > 1 and not self.plain_models and not self._plain(optimizer)):
            return True
        self.done.add(id(optimizer))
        factor = self.world / (self.unit * self._total())
        grads = [_local(p.grad) for p in self._plain(optimizer) if p.grad is not None]
        if grads and factor != 1.0:
            torch._foreach_mul_(grads, factor)
        return True

    def _total(self) -> float:
        if self.total is None:
            found = self._read_pending()
            if found is not None:
                self.total = found
            elif self.world > 1:  # no reduction carried it: one all-reduce of the count
                self.total = float(self.reduce(self.local))
            else:
                self.total = self.local
        return self.total

    def _read_pending(self) -> float | None:
        # a host read: on a GPU it waits for the backward (as GradScaler's step does)
        return None if self.pending is None else float(self.pending)

    def _plain(self, optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
        """The optimizer's parameters that no reduction divided by the count."""
        found = self._uncovered.get(optimizer)
        if found is None:
            covered = {id(p) for s in self.syncs for p in s.parameters()}
            found = [p for g in optimizer.param_groups for p in g["params"]
                     if id(p) not in covered]
            self._uncovered[optimizer] = found
        return found

    def _rescales(self) -> bool:
        return not self.unit_window and (self.world == 1 or self.plain_models)


def observed_count(plan: StepPlan, loaders: Loaders, calls: tuple[Callable[..., Any], ...],
                   around: Callable[..., Any] | None) -> Callable[[torch.Tensor, Any], None]:
    """``run.backward(loss, count=n)`` with the observers that watch it: ``calls`` before
    (recorders), ``around`` the backward (a watch of its all-reduce)."""
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
            around(counted, loss, n)

    return backward
