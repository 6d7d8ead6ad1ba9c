"""Registering training objects with a run, saving them and resuming from the newest checkpoint."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.background import SaveHandle, run_job, start
from splitsync.ckpt.fs import open_storage
from splitsync.ckpt.full import load_full
from splitsync.ckpt.reading import CheckpointWarning, find_checkpoint
from splitsync.ckpt.saving import STATE_FILE, build_job, rank_file
from splitsync.ckpt.sharded import load_sharded
from splitsync.ckpt.staging import Stager
from splitsync.ckpt.state import owner_of, restore_loader, restore_rng
from splitsync.ckpt.store import CheckpointError
from splitsync.data.loader import DeviceLoader
from splitsync.dist.seeding import Generators

__all__ = ["ResumeState", "Checkpointer", "CheckpointWarning", "STATE_FILE", "rank_file"]

RESERVED = ("step", "epoch")


@dataclass(frozen=True)
class ResumeState:
    """Where to continue: ``step`` optimizer steps done, ``epoch`` to start, the saved extras."""

    step: int = 0
    epoch: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    path: Path | str | None = None  # the checkpoint loaded (a URL in object storage)
    world_size: int | None = None  # of the run that wrote it

    @property
    def resumed(self) -> bool:
        return self.path is not None


class Checkpointer:
    """The objects registered by ``run.resume`` and the step counter they advance."""

    def __init__(self, root: str | os.PathLike[str], objects: Mapping[str, Any], *, keep: int,
                 rank: int, world_size: int, generators: Generators | None = None) -> None:
        if not isinstance(keep, int) or keep < 2:
            raise ValueError(f"keep={keep!r}: keep at least 2 checkpoints, so one complete "
                             "checkpoint always survives a crash during the next save.")
        bad = sorted(set(objects) & set(RESERVED))
        if bad:
            raise TypeError(f"run.resume(...) cannot register objects named {bad}; rename them.")
        self.where = root
        self.generators = generators  # the run's run.generator streams, part of its RNG state
        self.storage = open_storage(root)
        self.root = self.storage.root
        self.inflight: SaveHandle | None = None
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.models: dict[str, nn.Module] = {}
        self.optims: dict[str, tuple[torch.optim.Optimizer, str]] = {}
        self.others: dict[str, Any] = {}
        for name, obj in objects.items():
            if isinstance(obj, nn.Module):
                self.models[name] = obj
        for name, obj in objects.items():
            if isinstance(obj, nn.Module):
                continue
            if isinstance(obj, torch.optim.Optimizer):
                self.optims[name] = (obj, owner_of(obj, self.models))
            elif callable(getattr(obj, "state_dict", None)) and callable(
                    getattr(obj, "load_state_dict", None)):
                self.others[name] = obj
            else:
                raise TypeError(f"run.resume(..., {name}=...): a {type(obj).__name__} has no "
                                "state_dict()/load_state_dict(); pass it to run.save() as an "
                                "extra instead.")
        self.step = 0
        self._counting = True
        self._hook: Any = None
        self._pending: list[tuple[dict[str, int], torch.Tensor | None]] = []

    # --- step counting -------------------------------------------------------------------
    def _on_step(self, *_: Any) -> None:
        if self._counting:
            self.step += 1

    def _start_counting(self) -> None:
        if self._hook is None and self.optims:
            first = next(iter(self.optims.values()))[0]
            self._hook = first.register_step_post_hook(self._on_step)

    def close(self, raise_errors: bool = True) -> None:
        """Wait for a background save, then stop counting optimizer steps."""
        try:
            self.wait_saves(raise_errors)
        finally:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None

    # --- saving --------------------------------------------------------------------------
    def save(self, where: str | os.PathLike[str] | None, loaders: Sequence[DeviceLoader], *,
             step: int | None, epoch: int | None, extra: Mapping[str, Any],
             blocking: bool = True, group: Any = None,
             stager: Stager | None = None) -> Path | str | SaveHandle:
        """Collective: write everything registered as ``step-<step>/`` under ``where`` (the
        resume directory by default). Blocking: returns its location once committed;
        ``blocking=False``: returns a :class:`SaveHandle` once the state is staged, and the
        background thread's handshakes run on ``group`` (never the training loop's)."""
        self.wait_saves()  # at most one in flight; an earlier failure is raised here
        if step is None:
            if not self.optims:
                raise TypeError("run.save(...) cannot count steps without a registered "
                                "optimizer; pass step=<number of steps done>.")
            step = self.step
        storage = self.storage if where is None or str(where) == str(self.where) else \
            open_storage(where)
        self._counting = False  # DCP may step optimizers to build their state
        try:
            job = build_job(self, storage, loaders, step=step, epoch=epoch, extra=extra,
                            blocking=blocking, group=group, stager=stager)
        finally:
            self._counting = True
        if blocking:
            run_job(job)
            return Path(job.final) if storage.local else job.final
        self.inflight = start(job)
        return self.inflight

    def wait_saves(self, raise_errors: bool = True) -> None:
        """Wait for the background save in flight, if any; raise its error."""
        h, self.inflight = self.inflight, None
        if h is None:
            return
        h._done.wait()
        if raise_errors:
            h.raise_if_failed()

    # --- loading -------------------------------------------------------------------------
    def load(self, loaders: Sequence[DeviceLoader]) -> ResumeState:
        """Collective: load the newest complete checkpoint under ``root``, or start fresh."""
        found = find_checkpoint(self.storage, self.rank, self.world_size, self._needed)
        if found is None:
            self._start_counting()
            return ResumeState()
        name, body, state, per_rank = found
        self._counting = False
        try:
            extra = self._load_objects(name, body, state)
        finally:
            self._counting = True
        generators: list[torch.Tensor | None] = []
        if self.generators is not None:  # shared streams: one state for every rank
            self.generators.restore(state.get("generators", {}))
        if per_rank is not None:  # ranks beyond the saved world size keep their fresh seeds
            restore_rng(per_rank["rng"], self.generators)
            generators = list(per_rank["generators"])
        self._pending = [(pos, generators[i] if i < len(generators) else None)
                         for i, pos in enumerate(body["loaders"])]
        for i, ld in enumerate(loaders):
            self.attach_loader(ld, i)
        self.step = int(body["step"])
        self._start_counting()
        where = self.storage.where(name)
        return ResumeState(step=self.step, epoch=int(body["epoch"]), extra=extra,
                           path=Path(where) if self.storage.local else where,
                           world_size=int(body["world_size"]))

    def _needed(self, body: Mapping[str, Any]) -> list[str]:
        return [STATE_FILE, rank_file(self.rank)]

    def attach_loader(self, loader: DeviceLoader, index: int) -> None:
        """Continue the ``index``-th loader made by the run where the checkpoint left it."""
        if index < len(self._pending):
            pos, gen = self._pending[index]
            restore_loader(loader, pos, gen)

    def _load_objects(self, name: str, body: Mapping[str, Any],
                      state: Mapping[str, Any]) -> dict[str, Any]:
        missing = [n for n in (*self.models, *self.optims, *self.others)
                   if n not in (*body["models"], *body["optimizers"], *body["objects"])]
        where = self.storage.where(name)
        if missing:
            raise CheckpointError(f"checkpoint {where} has no state for {missing}; it holds "
                                  f"{[*body['models'], *body['optimizers'], *body['objects']]}.")
        if body["layout"] == "sharded":
            if not self.storage.local:
                raise CheckpointError(f"{where}: sharded checkpoints are read from a "
                                      "filesystem path, not from object storage.")
            load_sharded(Path(self.storage.root) / name, self.models, self.optims)
        else:
            load_full(name, state, self.models, self.optims)
        for n, o in self.others.items():
            o.load_state_dict(state["objects"][n])
        return {**body["extra"], **state["extra"]}
