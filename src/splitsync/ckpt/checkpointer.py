"""The run's checkpoints: ``run.resume``, ``run.save``, ``run.load``, ``run.export`` and the
save in flight. One :class:`Checkpointer` per run holds what ``run.resume`` registered
(without it, what the run wrapped), the optimizer-step count saves are named after, and the
save lifecycle (staging buffers, the background gloo group, the save in flight, the threads
freeing replaced optimizer state). :meth:`Checkpointer.settle` is the one place that waits
for a background save: before the next save or resume, at ``close``, and after each
``run.step`` while a save is in flight (through a watch attached only for that long).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.find import find_checkpoint, locate
from splitsync.ckpt.fs import Storage, newer_steps, open_dir, set_aside_newer
from splitsync.ckpt.load import (
    Freeing,
    ResumeState,
    load_models,
    load_objects,
    reopen_window,
    unregistered,
)
from splitsync.ckpt.save import (
    STATE_FILE,
    SaveHandle,
    SaveWatch,
    Window,
    build_job,
    collect,
    destroy_side_group,
    rank_file,
    run_job,
    side_group,
    start,
)
from splitsync.ckpt.staging import Stager, restore_rank_buffers
from splitsync.ckpt.state import Registered, register, restore_loader, split_state
from splitsync.data.build import ResumableLoader
from splitsync.distributed.rng import RngArrival
from splitsync.distributed.seeding import Generators
from splitsync.errors import CheckpointError, CheckpointWarning
from splitsync.observe import Observer, chain_around, overriding, redirect

__all__ = ["ResumeState", "Checkpointer", "CheckpointWarning", "STATE_FILE", "rank_file"]


class Checkpointer:
    """resume/save/load/export for one run. ``loaders`` is the run's live list of loaders;
    ``watch``/``unwatch`` add and remove an observer of ``run.step`` alone; ``wrapped()``
    names what the run wrapped (models, optimizers it stepped, EMAs), which saves and loads
    take when nothing is registered."""

    def __init__(self, rank: int, world_size: int, loaders: Sequence[ResumableLoader], *,
                 generators: Generators | None = None, timeout: Any = None,
                 save_blocking: bool = True, watch: Callable[[Observer], Any] | None = None,
                 unwatch: Callable[[Observer], None] | None = None,
                 wrapped: Callable[[], dict[str, Any]] = dict,
                 window: Window | None = None, loader_hooks: Any = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.loaders = loaders
        self.window = window  # the run's accumulation window: a save inside one keeps it
        self.generators = generators  # the run's run.generator streams, part of its RNG state
        self.timeout = timeout
        self.init_save_blocking = save_blocking  # init(save_blocking=...)
        self.save_blocking = save_blocking  # run.save's default: init's, or run.resume's
        self._watch_steps, self._unwatch_steps = watch, unwatch
        self.wrapped = wrapped
        self.loader_hooks = loader_hooks  # the run's LoaderHooks: a loader's first batch
        self.arrival: RngArrival | None = None  # global RNG states read, not set yet
        # set by run.resume
        self.where: Any = None
        self.storage: Storage | None = None
        self.registered: Registered | None = None  # None: saves take what the run wrapped
        self.keep = 3
        self.loaded: tuple[Storage, str, dict[str, Any]] | None = None  # the last one read
        self._rank_buffers: dict[str, Any] = {}  # this rank's buffers in it (rank_buffers)
        self.step = 0  # optimizer steps the run took (see count); a checkpoint loaded sets it
        self._hook: Any = None  # post-hook counting the steps of the optimizer below
        self._counted: Any = None
        self._counting = True
        self._pending: list[tuple[Mapping[str, int], torch.Tensor | None]] = []
        self._ahead: list[str] = []  # rank 0: checkpoints newer than a step resumed on purpose
        # the save lifecycle, for the whole run
        self.inflight: SaveHandle | None = None
        self.last_saved: tuple[int, Any] | None = None  # (step, path) of the last commit
        self._watch: SaveWatch | None = None
        self._stager: Stager | None = None  # host buffers of background saves, reused
        self._reserved = False
        self._group: Any = None  # gloo group of background saves: made on first use
        self._freeing: list[Freeing] = []  # threads freeing optimizer state a load replaced
        self.set_observers(())

    @property
    def models(self) -> Mapping[str, nn.Module]:
        if self.registered is not None:
            return self.registered.models
        return {n: m for n, m in self.wrapped().items() if isinstance(m, nn.Module)}

    def _register(self, objects: Mapping[str, Any], keep: int) -> Registered:
        return register(objects, rank=self.rank, world_size=self.world_size, keep=keep,
                        generators=self.generators)

    # --- observers -----------------------------------------------------------------------
    def set_observers(self, observers: Sequence[Observer]) -> None:
        self._on_save = overriding(observers, "on_save")
        self._on_staged = overriding(observers, "on_save_staged")
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
    def resume(self, dir: str | os.PathLike[str], *, step: int | None = None, keep: int = 3,
               save_blocking: bool | None = None, **objects: Any) -> ResumeState:
        """Collective: register ``objects`` and load the newest complete checkpoint under
        ``dir`` (``step``: that step, or an error listing the steps there), or start fresh.
        A step folder ``dir/step-000050`` resumes that step of ``dir``."""
        self.settle(wait=True)  # the save in flight commits (or raises) first
        where, step = locate(self._path(dir), step)
        # no objects: what the run wrapped, looked up again at each save
        registered = self._register(objects or self.wrapped(), keep)
        first = next(iter(registered.optims.values()))[0] if registered.optims else None
        if objects and first is not None and self._hook is not None and first is not self._counted:
            self._hook.remove()  # a registration never resets the count of the optimizer it
            self._hook, self.step = None, 0  # counts; another optimizer starts its own
        storage = open_dir(where)
        self.where, self.storage = where, storage
        self.registered = registered if objects else None
        self.keep = keep
        self.save_blocking = self.init_save_blocking if save_blocking is None else save_blocking
        self._reserved = False
        state = self._load(storage, registered, step=step, check=not objects)
        self._ahead = newer_steps(storage, step) if state.resumed and self.rank == 0 else []
        self._start_counting(registered)
        if not self.save_blocking:
            self.reserve()  # on a thread, and only once the optimizers have state
        return self._resumed(state)

    def _resumed(self, state: ResumeState) -> ResumeState:
        if state.resumed:
            for obs in self._on_resume:
                obs.on_resume(state.path, state.step)
        for obs in self._after_resume:
            obs.after_resume(state)
        return state

    def load(self, dir: str | os.PathLike[str], objects: Mapping[str, Any] | None = None,
             step: int | None = None) -> ResumeState:
        """Collective: load the checkpoint of ``step`` (None: the newest) under ``dir`` into
        ``objects`` (else what is registered, else what the run wrapped), RNG states and
        loader positions included; registers nothing. No checkpoint there is an error."""
        self.settle(wait=True)
        reg = self._register(objects, self.keep) if objects else (
            self.registered or self._register(self.wrapped(), self.keep))
        where = self._path(dir)
        state = self._load(open_dir(where), reg, step=step,
                           check=not objects and self.registered is None)
        if not state.resumed:
            raise CheckpointError(f"run.load: no checkpoint under {str(where)!r}; "
                                  "run.resume(dir, ...) starts fresh when there is none.")
        return self._resumed(state)

    def add_late(self, name: str, module: nn.Module) -> None:
        """Register ``module`` (an EMA made after ``run.resume``) and, if the checkpoint
        last loaded holds it, load its state now. Collective."""
        if self.registered is not None:
            self.registered = replace(self.registered,
                                      models={**self.registered.models, name: module})
        if self.loaded is not None and name in self.loaded[2]["models"]:
            load_models(*self.loaded, STATE_FILE, {name: module})
            restore_rank_buffers({name: module}, self._rank_buffers)

    def _load(self, storage: Storage, reg: Registered, step: int | None = None,
              check: bool = False) -> ResumeState:
        self._pending = []
        found = find_checkpoint(storage, self.rank, self.world_size,
                                lambda body: [STATE_FILE, rank_file(self.rank)], step)
        if found is None:  # a fresh start: the steps taken so far still count
            return ResumeState(step=self.step)
        name, body, state, per_rank = found
        lost = unregistered(body, reg) if check else []
        if lost:  # what the run wrapped lacks them: never drop saved state silently
            raise CheckpointError(
                f"checkpoint {storage.where(name)} holds optimizer state {lost}, and this run "
                "has stepped no optimizer to load it into yet: register it, "
                f"run.resume(dir, model=model, {lost[0]}=opt).")
        self.loaded = (storage, name, body)
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
        self.arrival = self.arrival and self.arrival.disarm()  # an earlier load's: superseded
        if per_rank is not None:  # ranks beyond the saved world size keep their fresh seeds
            self.arrival = RngArrival(per_rank["rng"], self.generators, reg.models,  # later
                                      self.loader_hooks, self._watch_steps, self._unwatch_steps)
            generators = list(per_rank["generators"])
        self._pending = [(pos, generators[i] if i < len(generators) else None)
                         for i, pos in enumerate(body["loaders"])]
        for i, loader in enumerate(self.loaders):
            self._continue(loader, i)
        mine = per_rank or {}  # this rank's part of the window saved in (gradients, count)
        self._rank_buffers = mine.get("buffers", {})  # its BatchNorm statistics: its own
        restore_rank_buffers(reg.models, self._rank_buffers)
        reopen_window(self.window, reg.models, body.get("window"), mine.get("window", {}),
                      world_size=self.world_size, saved_world=int(body["world_size"]),
                      where=storage.where(name), own=mine.get("window_own", {}))
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
    def _start_counting(self, reg: Registered) -> None:
        if reg.optims:
            self.count(next(iter(reg.optims.values()))[0])

    def count(self, optimizer: torch.optim.Optimizer) -> None:
        """Count the run's optimizer steps on ``optimizer`` unless one is counted already
        (``run.step`` gives each new optimizer, ``run.resume`` the first it registers)."""
        if self._hook is None:
            self._hook, self._counted = optimizer.register_step_post_hook(self._on_step), optimizer

    def _on_step(self, *_: Any) -> None:
        if self._counting:
            self.step += 1
            if not self.save_blocking and not self._reserved:
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
             state: Mapping[str, Any] | None = None, **extra: Any) -> Path | str | SaveHandle:
        """Collective: write ``state``'s objects, else everything registered, else what the
        run wrapped, as ``step-<step>/`` under ``dir`` (the resume directory by default).
        Blocking: returns its location once committed; ``blocking=False``: returns a
        :class:`SaveHandle` once the state is staged, and the background thread's handshakes
        run on a group of their own (never the loop's)."""
        self.settle(wait=True)  # at most one save in flight; an earlier failure raises here
        reg, storage, extra = self._target(dir, state, extra)
        for obs in self._before_save:
            obs.before_save(step)
        ahead, self._ahead = self._ahead, []
        set_aside_newer(self.storage, ahead)
        blocking = self.save_blocking if blocking is None else blocking
        if step is None:
            if self._hook is None and not reg.optims:
                raise TypeError("run.save(...) names checkpoints after optimizer steps, and "
                                "this run has stepped no optimizer: pass step=<steps done>.")
            step = self.step
        if not blocking:  # the background save's group and staging buffers: made once
            if self._group is None:
                self._group = side_group(self.world_size, self.timeout)
            self._stager = self._stager if self._stager is not None else Stager()
        group = None if blocking else self._group
        self._counting = False  # DCP may step optimizers to build their state
        try:  # states a resume read and has not set yet are what this step holds
            with self.arrival.as_set() if self.arrival else contextlib.nullcontext():
                job = build_job(reg, storage, self.loaders, step=step, epoch=epoch,
                                extra=extra, blocking=blocking, group=group,
                                stager=self._stager, call=self._call, window=self.window)
        finally:
            self._counting = True
        if blocking:
            run_job(job)
            path = Path(job.final) if storage.local else job.final
            self._saved(path, step)
            return path
        self.inflight = start(job)
        if self._watch_steps is not None:
            self._watch = SaveWatch(self)
            self._watch_steps(self._watch)
        for obs in self._on_staged:
            obs.on_save_staged(step)
        return self.inflight

    def _target(self, dir: Any, state: Mapping[str, Any] | None,
                extra: dict[str, Any]) -> tuple[Registered, Storage, dict[str, Any]]:
        """What a save writes, where, and its extras (``state``'s plain values join them)."""
        if state is not None:
            objects, plain = split_state(state)
            both = sorted(set(plain) & set(extra))
            if both:
                raise TypeError(f"run.save(state=..., **extra): {both} given twice.")
            extra = {**plain, **extra}
            reg = self._register(objects, self.keep)
        else:
            reg = self.registered or self._register(self.wrapped(), self.keep)
        root = None if dir is None else self._path(dir)
        if root is None and self.storage is None:
            raise TypeError("run.save() needs a directory when run.resume(dir, ...) was not "
                            "called: run.save('ckpt/').")
        if root is None or str(root) == str(self.where):
            return reg, self.storage, extra  # type: ignore[return-value]
        return reg, open_dir(root), extra
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
        from splitsync.ckpt.export import export_run_model

        return export_run_model(self.models, model, self._path(path), self.rank)

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
