"""The run's checkpoints: ``run.resume``, ``run.save``, ``run.export`` and the save in flight.

One :class:`Checkpointer` per run holds what ``run.resume`` registered, the optimizer-step
count a save is named after, and the save lifecycle: the staging buffers, the background
gloo group, the save in flight and the threads freeing replaced optimizer state.
:meth:`Checkpointer.settle` is the one place that waits for a background save; it is called
before the next save or resume, at ``close``, and (without waiting) after each ``run.step``
while a save is in flight, through a watch attached only for that long, so a run without a
save in flight pays nothing per step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.fs import Storage, open_storage
from splitsync.ckpt.load import Freeing, find_checkpoint, load_objects
from splitsync.ckpt.save import (
    STATE_FILE,
    SaveHandle,
    build_job,
    collect,
    destroy_side_group,
    rank_file,
    run_job,
    side_group,
    start,
)
from splitsync.ckpt.staging import Stager
from splitsync.ckpt.state import Registered, register, restore_loader, restore_rng
from splitsync.data.build import ResumableLoader
from splitsync.distributed.seeding import Generators
from splitsync.errors import CheckpointError, CheckpointWarning
from splitsync.observe import Observer, chain_around, overriding, redirect

__all__ = ["ResumeState", "Checkpointer", "CheckpointWarning", "STATE_FILE", "rank_file"]


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


class _SaveWatch(Observer):
    """Attached while a background save is in flight: its outcome surfaces at ``run.step``."""

    def __init__(self, owner: Checkpointer) -> None:
        self.owner = owner

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        # After the step, not before: each rank learns of the failure at its own step, and a
        # rank that raised before stepping would have skipped a step the others took.
        self.owner.settle(wait=False)


class Checkpointer:
    """resume/save/export for one run. ``loaders`` is the run's live list of loaders;
    ``watch``/``unwatch`` add and remove an observer of ``run.step`` alone."""

    def __init__(self, rank: int, world_size: int, loaders: Sequence[ResumableLoader], *,
                 generators: Generators | None = None, timeout: Any = None,
                 blocking: bool = True, watch: Callable[[Observer], Any] | None = None,
                 unwatch: Callable[[Observer], None] | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.loaders = loaders
        self.generators = generators  # the run's run.generator streams, part of its RNG state
        self.timeout = timeout
        self.default_blocking = blocking  # init(save_blocking=...)
        self.blocking = blocking  # run.save's default: init's, or run.resume's save_blocking
        self._watch_steps, self._unwatch_steps = watch, unwatch
        # set by run.resume
        self.where: Any = None
        self.storage: Storage | None = None
        self.registered: Registered | None = None
        self.step = 0
        self._hook: Any = None  # post-hook counting the first optimizer's steps
        self._counting = True
        self._pending: list[tuple[Mapping[str, int], torch.Tensor | None]] = []
        # the save lifecycle, for the whole run
        self.inflight: SaveHandle | None = None
        self.last_saved: tuple[int, Any] | None = None  # (step, path) of the last commit
        self._watch: _SaveWatch | None = None
        self._stager: Stager | None = None  # host buffers of background saves, reused
        self._reserved = False
        self._group: Any = None  # gloo group of background saves: made on first use
        self._freeing: list[Freeing] = []  # threads freeing optimizer state a load replaced
        self.set_observers(())

    @property
    def models(self) -> Mapping[str, nn.Module]:
        return {} if self.registered is None else self.registered.models

    # --- observers -----------------------------------------------------------------------
    def set_observers(self, observers: Sequence[Observer]) -> None:
        self._on_save = overriding(observers, "on_save")
        self._on_resume = overriding(observers, "on_resume")
        self._after_resume = overriding(observers, "after_resume")
        self._before_save = overriding(observers, "before_save")
        self._redirect = overriding(observers, "redirect_path")
        self._around = chain_around(observers)

    def _call(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A checkpoint's collective, inside the observers' ``around_collective``."""
        around = self._around
        return fn(*args) if around is None else around(op, fn, *args)

    def _path(self, path: str | os.PathLike[str]) -> Any:
        # URLs (s3://...) are never redirected: sandboxes hold local directories only
        if not self._redirect or "://" in str(path):
            return path
        return redirect(self._redirect, Path(path))

    # --- resume --------------------------------------------------------------------------
    def resume(self, dir: str | os.PathLike[str], *, keep: int = 3,
               save_blocking: bool | None = None, **objects: Any) -> ResumeState:
        """Collective: register ``objects`` and load the newest complete checkpoint under
        ``dir``, or start fresh."""
        self.settle(wait=True)  # the save in flight commits (or raises) first
        where = self._path(dir)
        registered = register(objects, rank=self.rank, world_size=self.world_size, keep=keep,
                              generators=self.generators)
        storage = _open(where)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.where, self.storage, self.registered = where, storage, registered
        self.blocking = self.default_blocking if save_blocking is None else save_blocking
        self._reserved = False
        state = self._load(storage, registered)
        self._start_counting()
        if not self.blocking:
            self.reserve()  # on a thread, and only once the optimizers have state
        if state.resumed:
            for obs in self._on_resume:
                obs.on_resume(state.path, state.step)
        for obs in self._after_resume:
            obs.after_resume(state)
        return state

    def _load(self, storage: Storage, reg: Registered) -> ResumeState:
        self._pending = []
        self.step = 0
        found = find_checkpoint(storage, self.rank, self.world_size,
                                lambda body: [STATE_FILE, rank_file(self.rank)])
        if found is None:
            return ResumeState()
        name, body, state, per_rank = found
        self._counting = False  # DCP may step optimizers to build their state
        try:
            extra, freeing = load_objects(storage, name, body, state, reg)
        finally:
            self._counting = True
        if freeing is not None:
            self._freeing.append(freeing)
        generators: list[torch.Tensor | None] = []
        if self.generators is not None:  # shared streams: one state for every rank
            self.generators.restore(state.get("generators", {}))
        if per_rank is not None:  # ranks beyond the saved world size keep their fresh seeds
            restore_rng(per_rank["rng"], self.generators)
            generators = list(per_rank["generators"])
        self._pending = [(pos, generators[i] if i < len(generators) else None)
                         for i, pos in enumerate(body["loaders"])]
        for i, loader in enumerate(self.loaders):
            self._continue(loader, i)
        self.step = int(body["step"])
        where = storage.where(name)
        return ResumeState(step=self.step, epoch=int(body["epoch"]), extra=extra,
                           path=Path(where) if storage.local else where,
                           world_size=int(body["world_size"]))

    def attach_loader(self, loader: ResumableLoader) -> None:
        """A loader made after ``run.resume`` continues where the checkpoint left it."""
        self._continue(loader, len(self.loaders) - 1)

    def _continue(self, loader: ResumableLoader, index: int) -> None:
        if index < len(self._pending):
            pos, gen = self._pending[index]
            restore_loader(loader, pos, gen)

    # --- step counting -------------------------------------------------------------------
    def _start_counting(self) -> None:
        reg = self.registered
        if self._hook is None and reg is not None and reg.optims:
            first = next(iter(reg.optims.values()))[0]
            self._hook = first.register_step_post_hook(self._on_step)

    def _on_step(self, *_: Any) -> None:
        if self._counting:
            self.step += 1
            if not self.blocking and not self._reserved:
                self.reserve()  # the optimizer has state now: its shapes are known

    # --- save ----------------------------------------------------------------------------
    def reserve(self) -> None:
        """Make the staging buffers of the next background save now, on a thread, so the
        first save stalls no longer than later ones (host memory: one copy of this rank's
        state, pinned for device tensors). Waits until every optimizer has state: DCP would
        make it by taking a step."""
        reg = self.registered
        if reg is None or any(not o.state for o, _ in reg.optims.values()):
            return  # retried after the next optimizer step
        self._reserved = True
        self._counting = False
        try:
            state = collect(reg, offload=False)
        finally:
            self._counting = True
        if self._stager is None:
            self._stager = Stager()
        self._stager.reserve(state, reg.live())

    def save(self, dir: str | os.PathLike[str] | None = None, *, step: int | None = None,
             epoch: int | None = None, blocking: bool | None = None,
             **extra: Any) -> Path | str | SaveHandle:
        """Collective: write everything registered as ``step-<step>/`` under ``dir`` (the
        resume directory by default). Blocking: returns its location once committed;
        ``blocking=False``: returns a :class:`SaveHandle` once the state is staged, and the
        background thread's handshakes run on a group of their own (never the loop's)."""
        reg = self.registered
        if reg is None or self.storage is None:
            raise RuntimeError("run.save() saves the objects registered by run.resume(dir, "
                               "model=..., optimizer=...); call run.resume first.")
        self.settle(wait=True)  # at most one save in flight; an earlier failure raises here
        for obs in self._before_save:
            obs.before_save(step)
        blocking = self.blocking if blocking is None else blocking
        if step is None:
            if not reg.optims:
                raise TypeError("run.save(...) cannot count steps without a registered "
                                "optimizer; pass step=<number of steps done>.")
            step = self.step
        root = None if dir is None else self._path(dir)
        storage = self.storage if root is None or str(root) == str(self.where) else \
            _open(root)
        group = None
        if not blocking:
            if self._group is None:
                self._group = side_group(self.world_size, self.timeout)
            if self._stager is None:
                self._stager = Stager()
            group = self._group
        self._counting = False  # DCP may step optimizers to build their state
        try:
            job = build_job(reg, storage, self.loaders, step=step, epoch=epoch, extra=extra,
                            blocking=blocking, group=group, stager=self._stager,
                            call=self._call)
        finally:
            self._counting = True
        if blocking:
            run_job(job)
            path = Path(job.final) if storage.local else job.final
            self._saved(path, step)
            return path
        self.inflight = start(job)
        if self._watch_steps is not None:
            self._watch = _SaveWatch(self)
            self._watch_steps(self._watch)
        return self.inflight

    def settle(self, *, wait: bool, raise_errors: bool = True) -> None:
        """Finish with the background save in flight, if it is done (or ``wait``): its
        thread ends, the watch is detached, observers hear of the commit, and its failure
        is raised. The one place that waits for a save."""
        handle = self.inflight
        if handle is not None and not wait and not handle.done():
            return
        if self._watch is not None and self._unwatch_steps is not None:
            self._unwatch_steps(self._watch)  # the next run.step is the plain one again
        self._watch = None
        if handle is None:
            return
        self.inflight = None
        handle.finish()
        if raise_errors:
            handle.raise_if_failed()
        if handle.error is None:
            local = self.storage is None or self.storage.local
            self._saved(Path(handle.path) if local else handle.path, handle.step)

    def _saved(self, path: Any, step: int) -> None:
        self.last_saved = (step, path)
        for obs in self._on_save:
            obs.on_save(path, step)

    # --- export and teardown -------------------------------------------------------------
    def export(self, path: str | os.PathLike[str], model: nn.Module | None = None) -> Path | str:
        from splitsync.ckpt.export import export_safetensors

        if model is None:
            models = list(self.models.values())
            if len(models) != 1:
                raise TypeError("run.export(path) exports the model registered by run.resume; "
                                f"{len(models)} are registered, so pass model=...")
            model = models[0]
        return export_safetensors(model, self._path(path), self.rank)

    def close(self, clean: bool = True) -> None:
        """Wait for the save in flight (raising its failure when ``clean``), stop counting
        steps, finish freeing replaced optimizer state, free the staging buffers and destroy
        the background group (no thread holds it any more)."""
        try:
            self.settle(wait=True, raise_errors=clean)
        finally:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
            for freeing in self._freeing:
                freeing.finish()
            self._freeing = []
            if self._stager is not None:
                self._stager.clear()
                self._stager = None
            group, self._group = self._group, None
            if group is not None:
                destroy_side_group(group)
