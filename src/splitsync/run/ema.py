"""``run.ema``: an exponential moving average of a model's weights, kept next to it.

The EMA is a frozen copy laid out like the model (the user's module under DDP, FSDP2 shards
under FSDP: the strategy's ``replica``). After each optimizer step that really steps
(``StepPlan.stepped``: not inside an accumulation window, not skipped by the GradScaler) it
becomes ``decay * ema + (1 - decay) * weights``, shard by shard, with no communication.
Floating-point buffers are averaged the same way; other buffers (counters) are copied.
``every=k`` updates after every k-th optimizer step only, ``warmup=n`` copies the weights
for the first n, and ``decay`` may be a function of the optimizer step. The step is the
run's optimizer-step count (checkpointed), never a micro-step, so a resumed run continues
the same schedule.
``run.resume`` registers every EMA, so checkpoints hold it with no extra argument; one made
after ``run.resume`` is registered then, and loaded from the checkpoint if that holds it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from splitsync.observe import Observer
from splitsync.run.models import Models
from splitsync.run.step import StepPlan
from splitsync.train.precision import forward_with

__all__ = ["Emas", "Ema", "EMA_NAME", "Decay"]

EMA_NAME = "ema"  # checkpoint names: "ema", "ema_1", ... in the order run.ema made them

Decay = float | Callable[[int], float]  # a number, or a function of the optimizer step


def _local(t: torch.Tensor) -> torch.Tensor:
    # A DTensor's local shard is re-read every time: FSDP2 may swap the tensor behind a
    # parameter (its lazy init re-pads the shards), so a cached one could go stale.
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


class Ema:
    """One EMA: the module returned by ``run.ema`` and the tensors it follows."""

    def __init__(self, module: nn.Module, model: nn.Module, decay: Decay, *,
                 every: int = 1, warmup: int = 0,
                 steps: Callable[[], int] | None = None) -> None:
        self.module = module
        self.decay = decay
        self.every = every
        self.warmup = warmup
        self._steps = steps  # the run's optimizer steps so far (None: this EMA's own count)
        self._own_steps = 0
        self._owned = {id(p) for p in model.parameters()}
        mine = dict(module.named_parameters())
        theirs = dict(model.named_parameters())
        names = _aligned(list(mine), list(theirs))
        self._pairs = [(mine[m], theirs[t]) for m, t in names]
        mb, tb = dict(module.named_buffers()), dict(model.named_buffers())
        buffers = [(mb[m], tb[t]) for m, t in _aligned(list(mb), list(tb))]
        self._pairs += [(e, w) for e, w in buffers if e.is_floating_point()]
        self._copied = [(e, w) for e, w in buffers if not e.is_floating_point()]
        self._driver: weakref.ReferenceType[torch.optim.Optimizer] | None = None

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Average after a real step of the optimizer that trains the model.

        The first optimizer seen stepping the model's parameters drives the EMA, so two
        optimizers over one model still give one update per training step."""
        driver = None if self._driver is None else self._driver()
        if driver is None:
            if not any(id(p) in self._owned for g in optimizer.param_groups
                       for p in g["params"]):
                return
            self._driver = weakref.ref(optimizer)
        elif driver is not optimizer:
            return
        self._own_steps += 1
        step = self._steps() if self._steps is not None else self._own_steps
        if step <= self.warmup:
            self.update(0.0)  # warm-up: the average is the weights
        elif step % self.every == 0:
            self.update(self.decay_at(step))

    def decay_at(self, step: int) -> float:
        """The decay used by the update after optimizer step ``step`` (counted from 1)."""
        if not callable(self.decay):
            return float(self.decay)
        value = self.decay(step)
        if isinstance(value, torch.Tensor):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0.0 <= value <= 1.0):
            raise ValueError(f"run.ema(decay=...): the function returned {value!r} at "
                             f"optimizer step {step}; it must return a number in [0, 1].")
        return float(value)

    @torch.no_grad()
    def update(self, decay: float | None = None) -> None:
        """``ema = decay * ema + (1 - decay) * weights`` on this rank's tensors (``decay``
        None: the EMA's own, when it is a number)."""
        if decay is None:
            decay = self.decay_at(self._own_steps) if callable(self.decay) else self.decay
        if self._pairs:
            ema = [_local(e) for e, _ in self._pairs]
            if decay == 0.0:  # a copy, not 0 * ema + w: bit-equal to the weights
                torch._foreach_copy_(ema, [_local(w) for _, w in self._pairs])
            else:
                torch._foreach_mul_(ema, decay)
                torch._foreach_add_(ema, [_local(w) for _, w in self._pairs], alpha=1 - decay)
        for e, w in self._copied:
            _local(e).copy_(_local(w))


def _aligned(mine: list[str], theirs: list[str]) -> list[tuple[str, str]]:
    # The copy has the user's names; the model may carry a wrapper's prefix ("module.").
    if len(mine) != len(theirs) or not all(t == m or t.endswith(f".{m}")
                                           for m, t in zip(mine, theirs, strict=True)):
        raise RuntimeError(f"run.ema: the copy's tensors {mine[:3]}... do not match the "
                           f"model's {theirs[:3]}... ({len(mine)} vs {len(theirs)}).")
    return list(zip(mine, theirs, strict=True))


class _EmaObserver(Observer):
    """Attached with the first EMA: updates every EMA after a ``run.step`` that stepped."""

    def __init__(self, plan: StepPlan, emas: list[Ema]) -> None:
        self.plan = plan
        self.emas = emas

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        if stepped:
            for ema in self.emas:
                ema.after_step(optimizer)


class Emas:
    """The run's EMAs: made by ``run.ema``, registered with ``run.resume``."""

    def __init__(self, plan: StepPlan, models: Models,
                 attach: Callable[[Observer], Any],
                 steps: Callable[[], int] | None = None) -> None:
        self.plan = plan
        self.models = models
        self.attach = attach
        self.steps = steps
        self.made: list[Ema] = []

    def make(self, model: nn.Module, decay: Decay, every: int = 1,
             warmup: int = 0) -> nn.Module:
        """See ``Run.ema``."""
        if not callable(decay) and (isinstance(decay, bool) or not isinstance(
                decay, (int, float)) or not 0.0 <= decay <= 1.0):
            raise ValueError(f"run.ema(model, decay={decay!r}): decay is the weight of the "
                             "old average, a number in [0, 1] such as 0.999, or a function "
                             "of the optimizer step that returns one.")
        for name, value, least in (("every", every, 1), ("warmup", warmup, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"run.ema(model, {name}={value!r}): {name} counts optimizer "
                                 f"steps, an integer >= {least}.")
        how = self.models.made(model)
        if how is None:
            raise TypeError(
                f"run.ema(model): this {type(model).__name__} was not returned by "
                "run.model(); pass the model run.model returned, e.g. "
                "model = run.model(net); ema = run.ema(model).")
        if how.template is None and how.template_error:
            raise RuntimeError(f"run.ema: the model could not be copied when run.model "
                               f"wrapped it ({how.template_error}).")
        copy = how.strategy.replica(model, how.template, how.ctx, how.options)
        if how.autocast:
            forward = copy.forward
            wrapped = forward_with(forward, self.plan.precision)
            if wrapped is not forward:
                copy.forward = wrapped  # evaluates under the run's precision like the model
        ema = Ema(copy, model, decay if callable(decay) else float(decay), every=every,
                  warmup=warmup, steps=self.steps)
        if not self.made:
            self.attach(_EmaObserver(self.plan, self.made))
        self.made.append(ema)
        return copy

    def with_emas(self, objects: Mapping[str, Any]) -> dict[str, Any]:
        """``objects`` plus every EMA not already among them, under free names."""
        out = dict(objects)
        given = {id(o) for o in objects.values()}
        n = 0
        for ema in self.made:
            if id(ema.module) in given:
                continue
            while (name := EMA_NAME if n == 0 else f"{EMA_NAME}_{n}") in out:
                n += 1
            out[name] = ema.module
        return out

    def trained_model(self, registered: Mapping[str, nn.Module]) -> nn.Module | None:
        """The one registered model that is not an EMA (``run.export``'s default); None
        when there is no EMA (``run.export`` then decides by itself)."""
        if not registered or not self.made:
            return None
        emas = {id(e.module) for e in self.made}
        models = [m for m in registered.values() if id(m) not in emas]
        if len(models) != 1:
            raise TypeError("run.export(path) exports the run's one model; it has "
                            f"{len(models)} besides the EMAs, so pass model=...")
        return models[0]
