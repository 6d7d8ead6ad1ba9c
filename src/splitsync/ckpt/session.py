"""Registering training objects with a run, saving them and resuming from the newest checkpoint."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.background import (
    SaveHandle,
    destroy_side_group,
    direct,
    run_job,
    side_group,
    start,
)
from splitsync.ckpt.fs import Storage, open_storage
from splitsync.ckpt.full import Freeing, load_full
from splitsync.ckpt.reading import CheckpointWarning, find_checkpoint
from splitsync.ckpt.saving import STATE_FILE, Registered, build_job, collect, rank_file
from splitsync.ckpt.sharded import load_sharded
from splitsync.ckpt.staging import Stager
from splitsync.ckpt.state import owner_of, restore_loader, restore_rng
from splitsync.ckpt.store import CheckpointError
from splitsync.data.loader import DeviceLoader
from splitsync.distributed.seeding import Generators

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


def _open(where: str | os.PathLike[str]) -> Storage:
    """The storage of a run's checkpoint directory; a path that is a file is refused at once
    (not found out at the first save, after training from scratch)."""
    path = Path(where)
    if "://" not in str(where) and path.exists() and not path.is_dir():
        raise CheckpointError(
            f"checkpoint directory {str(path)!r} is a regular file, not a directory: pass the "
            "directory that holds (or will hold) the step-* checkpoints, e.g. "
            f"{str(path.parent / 'ckpt')!r}.")
    return open_storage(where)


class Checkpointer:
    """The objects registered by ``run.resume``, the step counter they advance, and the save
    lifecycle: the staging buffers, the background group and the save in flight."""

    def __init__(self, root: str | os.PathLike[str], objects: Mapping[str, Any], *, keep: int,
                 rank: int, world_size: int, generators: Generators | None = None,
                 timeout: Any = None, call: Callable[..., Any] | None = None,
                 background: bool = False) -> None:
        if not isinstance(keep, int) or keep < 2:
            raise ValueError(f"keep={keep!r}: keep at least 2 checkpoints, so one complete "
                             "checkpoint always survives a crash during the next save.")
        bad = sorted(set(objects) & set(RESERVED))
        if bad:
            raise TypeError(f"run.resume(...) cannot register objects named {bad}; rename them.")
        self.where = root
        self.generators = generators  # the run's run.generator streams, part of its RNG state
        self.storage = _open(root)
        self.root = self.storage.root
        self.inflight: SaveHandle | None = None
        self._freeing: list[Freeing] = []  # threads freeing optimizer state a load replaced
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        self.call = call or direct  # runs a collective; the run's observers wrap it
        self.background = background  # saves default to the background: stage ahead
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
        self.registered = Registered(models=self.models, optims=self.optims,
                                     others=self.others, rank=rank, world_size=world_size,
                                     keep=keep, generators=generators)
        self.step = 0
        self._counting = True
        self._hook: Any = None
        self._pending: list[tuple[dict[str, int], torch.Tensor | None]] = []
        self._stager: Stager | None = None  # host buffers of background saves, reused
        self._group: Any = None  # gloo group of background saves: made on first use
        self._reserved = False

    # --- step counting -------------------------------------------------------------------
    def _on_step(self, *_: Any) -> None:
        if self._counting:
            self.step += 1
            if self.background and not self._reserved:
                self.reserve()  # the optimizer has state now: its shapes are known

    def _start_counting(self) -> None:
        if self._hook is None and self.optims:
            first = next(iter(self.optims.values()))[0]
            self._hook = first.register_step_post_hook(self._on_step)

    def close(self, raise_errors: bool = True, successor: Checkpointer | None = None) -> None:
        """Wait for a background save (its thread ended), stop counting optimizer steps,
        free the staging buffers, finish freeing replaced optimizer state and destroy the
        background group (no thread holds it any more). With a ``successor`` (a new
        ``run.resume`` of the same run) it gets group, buffers and freeing threads instead:
        one background group per run, and buffers that may fit again."""
        try:
            self.wait_saves(raise_errors)
        finally:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
            if successor is not None:
                successor._group, self._group = self._group, None
                successor._stager, self._stager = self._stager, None
                successor._freeing, self._freeing = self._freeing, []
            for freeing in self._freeing:
                freeing.finish()
            self._freeing = []
            if self._stager is not None:
                self._stager.clear()
                self._stager = None
            group, self._group = self._group, None
            if group is not None:
                destroy_side_group(group)

    # --- saving --------------------------------------------------------------------------
    def reserve(self) -> None:
        """Make the staging buffers of the next background save now, on a thread, so the
        first save stalls no longer than later ones (host memory: one copy of this rank's
        state, pinned for device tensors). Waits until every optimizer has state: DCP would
        make it by taking a step."""
        if any(not o.state for o, _ in self.optims.values()):
            return  # retried after the next optimizer step
        self._reserved = True
        self._counting = False
        try:
            state = collect(self.registered, offload=False)
        finally:
            self._counting = True
        if self._stager is None:
            self._stager = Stager()
        self._stager.reserve(state, self.registered.live())

    def save(self, where: str | os.PathLike[str] | None, loaders: Sequence[DeviceLoader], *,
             step: int | None, epoch: int | None, extra: Mapping[str, Any],
             blocking: bool = True) -> Path | str | SaveHandle:
        """Collective: write everything registered as ``step-<step>/`` under ``where`` (the
        resume directory by default). Blocking: returns its location once committed;
        ``blocking=False``: returns a :class:`SaveHandle` once the state is staged, and the
        background thread's handshakes run on a group of their own (never the loop's)."""
        self.wait_saves()  # at most one in flight; an earlier failure is raised here
        if step is None:
            if not self.optims:
                raise TypeError("run.save(...) cannot count steps without a registered "
                                "optimizer; pass step=<number of steps done>.")
            step = self.step
        storage = self.storage if where is None or str(where) == str(self.where) else \
            _open(where)
        group = None
        if not blocking:
            if self._group is None:
                self._group = side_group(self.world_size, self.timeout)
            if self._stager is None:
                self._stager = Stager()
            group = self._group
        self._counting = False  # DCP may step optimizers to build their state
        try:
            job = build_job(self.registered, storage, loaders, step=step, epoch=epoch,
                            extra=extra, blocking=blocking, group=group, stager=self._stager,
                            call=self.call)
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
        h.finish()
        if raise_errors:
            h.raise_if_failed()

    # --- loading -------------------------------------------------------------------------
    def load(self, loaders: Sequence[DeviceLoader]) -> ResumeState:
        """Collective: load the newest complete checkpoint under ``root``, or start fresh."""
        found = find_checkpoint(self.storage, self.rank, self.world_size, self._needed)
        if found is None:
            self._start_counting()
            if self.background:
                self.reserve()  # only if the optimizers already have state
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
        if self.background:
            self.reserve()  # on a thread: the resume returns while the buffers are made
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
            self._freeing.append(load_full(name, state, self.models, self.optims))
        for n, o in self.others.items():
            o.load_state_dict(state["objects"][n])
        return {**body["extra"], **state["extra"]}
