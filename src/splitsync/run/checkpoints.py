"""The Run's checkpoint verbs: ``run.resume``, ``run.save``, ``run.load`` and ``run.export``.

A mixin over the run's :class:`~splitsync.ckpt.checkpointer.Checkpointer` (``ckpt/checkpointer.py``
holds the registration, the step count and the save lifecycle). What a save writes, in
order of precedence: ``run.save(dir, state={...})``'s objects; else what ``run.resume``
registered; else what the run wrapped (:meth:`CheckpointVerbs._wrapped`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from splitsync.ckpt.checkpointer import Checkpointer, ResumeState
from splitsync.ckpt.state import split_state
from splitsync.distributed.logs import get_logger
from splitsync.run.collectives import Collectives
from splitsync.run.ema import Emas
from splitsync.run.meter import METER_NAME, EpochMeter
from splitsync.run.models import Models
from splitsync.run.training import Training

if TYPE_CHECKING:
    from splitsync.ckpt import SaveHandle
    from splitsync.run.preempt import Preemption
    from splitsync.run.tolerance import Tolerance

__all__ = ["CheckpointVerbs"]


def _numbered(name: str, objects: list[Any]) -> dict[str, Any]:
    return {name if i == 0 else f"{name}_{i}": o for i, o in enumerate(objects)}


class CheckpointVerbs:
    """The Run's checkpoint verbs (a mixin: the Run owns the parts named below)."""

    _checkpoints: Checkpointer
    _emas: Emas
    _meters: list[EpochMeter]
    _models: Models
    _training: Training
    is_main: bool
    _arm_preemption: Callable[[], Preemption | None]
    _tolerance: Tolerance
    _collectives: Collectives
    device: torch.device
    rank: int
    add_observer: Callable[[Any], Any]

    def _wrapped(self) -> dict[str, Any]:
        """What the run wrapped, by the names a save without registration gives them:
        ``model`` (the model the first optimizer ``run.step`` stepped trains; the others
        ``model_1``, ... in the order ``run.model`` made them), ``optimizer``,
        ``optimizer_1``, ... (in the order ``run.step`` first stepped them), ``ema``,
        ``ema_1``, ... (``run.ema``) and ``scaler`` (under "16-mixed")."""
        optims = [o for o in self._training.steps if isinstance(o, torch.optim.Optimizer)]
        trained = {id(p) for o in optims[:1] for g in o.param_groups for p in g["params"]}
        models = sorted(self._models.all(), key=lambda m: not any(
            id(p) in trained for p in m.parameters()))  # stable: otherwise in made order
        objects = {**_numbered("model", models), **_numbered("optimizer", optims)}
        if self._training.scaler is not None:
            objects["scaler"] = self._training.scaler
        return self._with_own(objects)

    def resume(self, dir: str | os.PathLike[str], *, step: int | None = None, keep: int = 3,
               save_blocking: bool | None = None, **objects: Any) -> ResumeState:
        """Register ``objects`` (``model=``, ``optimizer=``, ``scheduler=``, anything with
        ``state_dict()``/``load_state_dict()``) and every :meth:`ema` (as "ema", "ema_1",
        ...) for :meth:`save`, and load the newest complete checkpoint under ``dir`` (a path
        or an fsspec URL), RNG states and loader positions included; with no checkpoint
        there, start fresh. ``step=N`` (or a step folder, ``ckpt/step-000050``): that step
        (an error lists the steps there), whose parent later saves go to; newer ones are set
        aside at the next save. With no objects: what the run wrapped (models from ``run.model``,
        optimizers ``run.step`` stepped, EMAs, the scaler), looked up again at each save. ``keep``: the checkpoints :meth:`save` keeps (default 3, the
        newest; at least 2). ``save_blocking``: :meth:`save`'s default. Collective."""
        if objects:
            objects = self._with_own(objects)
        preemption = self._arm_preemption()
        state = self._tolerance.resume(objects, lambda objs: self._checkpoints.resume(
            dir, step=step, keep=keep, save_blocking=save_blocking, **objs))
        if preemption is not None:
            preemption.resumed()
        if state.resumed and self.is_main:  # one line, so a log shows where a run went on
            get_logger().info("resumed from %s at epoch %d, step %d (saved by %d process%s)",
                              state.path, state.epoch, state.step, state.world_size or 0,
                              "" if state.world_size == 1 else "es")
        return state

    def save(self, dir: str | os.PathLike[str] | None = None, *, step: int | None = None,
             epoch: int | None = None, blocking: bool | None = None,
             state: Mapping[str, Any] | None = None, **extra: Any) -> Path | str | SaveHandle:
        """Atomically save, as ``dir/step-<step>/`` (``dir``: the resume directory by
        default), what :meth:`resume` registered, or without it what the run wrapped (models
        from ``run.model``, optimizers ``run.step`` stepped, EMAs, the scaler), plus RNG states, loader positions and ``extra`` (JSON values or
        tensors); keeps the newest ``keep`` (3 by default). ``state={...}``: a dict in
        Fabric's style, its objects saved instead and its other values as extras. ``step``
        defaults to the optimizer steps the run took. ``blocking=False`` returns a
        :class:`~splitsync.ckpt.SaveHandle` once the state is staged in host memory (the next
        save, ``run.step`` or ``close`` raise a background failure). Collective. Under
        fault tolerance one replica group writes; the others' call returns None."""
        if not self._tolerance.writes():
            return None  # type: ignore[return-value]
        return self._checkpoints.save(dir, step=step, epoch=epoch, blocking=blocking,
                                      state=state, **extra)

    def load(self, dir: str | os.PathLike[str], state: MutableMapping[str, Any] | None = None,
             *, step: int | None = None) -> ResumeState:
        """Load the checkpoint of ``step`` (None: the newest complete one) under ``dir``, as
        Fabric's ``fabric.load(path, state)``: into ``state``'s objects, its other entries
        replaced in place by the saved values; without ``state``, into what :meth:`resume`
        registered or the run wrapped. RNG states and loader positions come back too, and
        the step count. Registers nothing; no checkpoint there is an error. Collective."""
        objects = None if state is None else split_state(state)[0]
        result = self._checkpoints.load(dir, objects, step)
        if state is not None:
            for key in [k for k in state if k not in (objects or {}) and k in result.extra]:
                state[key] = result.extra[key]
        return result

    def export(self, path: str | os.PathLike[str],
               model: nn.Module | None = None) -> Path | str:
        """Write the model's final weights to ``path`` (a path or an fsspec URL) as one
        unsharded safetensors file (``model=ema``: an EMA's); tied weights are written
        once, as ``save_pretrained`` does. Collective under FSDP."""
        if model is None:  # the EMAs are not "the model"
            model = self._emas.trained_model(self._checkpoints.models)
        return self._checkpoints.export(path, model)

    def meter(self) -> EpochMeter:
        """An epoch accumulator: ``meter.add(loss=loss, count=n)`` keeps per key the sum of
        value * count and of count on this rank; ``meter.compute()`` (collective) gives each
        key's weighted mean over every rank; ``meter.reset()`` when an epoch begins. Saved
        with the checkpoints ("meter", "meter_1", ...), so ``run.log(meter.compute())`` of a
        resumed epoch covers the whole epoch. Make it before :meth:`resume`."""
        if self._checkpoints.registered is not None or self._checkpoints.loaded is not None:
            raise RuntimeError("run.meter() after run.resume: make the meter before "
                               "run.resume, which registers it and loads its sums.")
        meter = EpochMeter(self.device, self.rank,
                           lambda t: self._collectives.reduce(t, "sum"))
        self._meters.append(meter)
        self.add_observer(meter)  # its before_save reduces the totals a save writes
        return meter

    def _with_own(self, objects: Mapping[str, Any]) -> dict[str, Any]:
        """``objects`` plus every EMA and every :meth:`meter` not among them, under free
        names ("ema", "ema_1", ...; "meter", "meter_1", ...)."""
        out = self._emas.with_emas(objects)
        given = {id(o) for o in out.values()}
        n = 0
        for meter in self._meters:
            if id(meter) in given:
                continue
            while (name := METER_NAME if n == 0 else f"{METER_NAME}_{n}") in out:
                n += 1
            out[name] = meter
        return out

    def _ema_made(self, ema: nn.Module) -> None:
        """An EMA made after :meth:`resume` joins the registration and is loaded from the
        checkpoint that resume read, if that holds it (collective)."""
        reg = self._checkpoints.registered
        base = {} if reg is None else {**reg.models, **reg.others,
                                       **{n: o for n, (o, _) in reg.optims.items()}}
        name = next(n for n, o in self._emas.with_emas(base).items() if o is ema)
        self._checkpoints.add_late(name, ema)
