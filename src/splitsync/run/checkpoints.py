"""The run's checkpoint part: exact resume, atomic (optionally background) save, export.

The checkpoint machinery (``splitsync.ckpt``) is imported on first use. A background save
is watched at the ``run.step`` boundary by an observer that is attached only while the save
is in flight, so a run without one pays nothing per step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from splitsync.distributed.seeding import Generators
from splitsync.observe import Observer, chain_around, overriding, redirect
from splitsync.run.config import RunConfig
from splitsync.run.data import Loaders

if TYPE_CHECKING:
    import torch

    from splitsync.ckpt import Checkpointer, ResumeState, SaveHandle

__all__ = ["Checkpoints"]


class _SaveWatch(Observer):
    """Attached while a background save is in flight: its outcome surfaces at ``run.step``."""

    def __init__(self, part: Checkpoints) -> None:
        self.part = part

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        # After the step, not before: each rank learns of the failure at its own step, and a
        # rank that raised before stepping would have skipped a step the others took.
        self.part.settle(wait=False)


class Checkpoints:
    """resume/save/export for one run; ``checkpointer`` is None until ``resume``."""

    def __init__(self, rank: int, world_size: int, loaders: Loaders,
                 config: RunConfig | None = None,
                 attach: Callable[[Observer], Any] | None = None,
                 detach: Callable[[Observer], None] | None = None,
                 generators: Generators | None = None) -> None:
        self.rank = rank
        self.generators = generators
        self.world_size = world_size
        self.loaders = loaders
        self.config = config if config is not None else RunConfig()
        self.checkpointer: Checkpointer | None = None
        self.blocking = self.config.save_blocking
        self._on_save: tuple[Observer, ...] = ()
        self._on_resume: tuple[Observer, ...] = ()
        self._after_resume: tuple[Observer, ...] = ()
        self._before_save: tuple[Observer, ...] = ()
        self._attach, self._detach = attach, detach
        self._watch: _SaveWatch | None = None
        self._redirect: tuple[Observer, ...] = ()
        self._around: Callable[..., Any] | None = None

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

    def resume(self, dir: str | os.PathLike[str], *, keep: int = 3,
               save_blocking: bool | None = None, **objects: Any) -> ResumeState:
        from splitsync.ckpt import Checkpointer

        if self.checkpointer is not None:
            self.settle(wait=True)  # the save in flight commits (or raises) first
        blocking = self.config.save_blocking if save_blocking is None else save_blocking
        new = Checkpointer(self._path(dir), objects, keep=keep, rank=self.rank,
                           world_size=self.world_size, generators=self.generators,
                           timeout=self.config.timeout, call=self._call,
                           background=not blocking)
        if self.checkpointer is not None:
            self.checkpointer.close(successor=new)  # hands over its group and buffers
        self.blocking, self.checkpointer = blocking, new
        state = new.load(self.loaders.all)
        if state.resumed:
            for obs in self._on_resume:
                obs.on_resume(state.path, state.step)
        for obs in self._after_resume:
            obs.after_resume(state)
        return state

    def attach_loader(self, loader: Any) -> None:
        """A loader made after ``resume`` continues where the checkpoint left it."""
        if self.checkpointer is not None:
            self.checkpointer.attach_loader(loader, len(self.loaders.all) - 1)

    def save(self, dir: str | os.PathLike[str] | None = None, *, step: int | None = None,
             epoch: int | None = None, blocking: bool | None = None,
             **extra: Any) -> Path | str | SaveHandle:
        ckpt = self.checkpointer
        if ckpt is None:
            raise RuntimeError("run.save() saves the objects registered by run.resume(dir, "
                               "model=..., optimizer=...); call run.resume first.")
        self.settle(wait=True)  # at most one save in flight; an earlier failure raises here
        for obs in self._before_save:
            obs.before_save(step)
        blocking = self.blocking if blocking is None else blocking
        root = None if dir is None else self._path(dir)
        out = ckpt.save(root, self.loaders.all, step=step, epoch=epoch, extra=extra,
                        blocking=blocking)
        if blocking:
            self._saved(out, ckpt.step if step is None else step)
        elif self._attach is not None:
            self._watch = _SaveWatch(self)
            self._attach(self._watch)
        return out

    def settle(self, *, wait: bool, raise_errors: bool = True) -> None:
        """Finish with the background save in flight, if it is done (or ``wait``): detach
        the watch, report the commit to observers, raise its failure."""
        ckpt = self.checkpointer
        handle = None if ckpt is None else ckpt.inflight
        if handle is not None and not wait and not handle.done():
            return
        if self._watch is not None and self._detach is not None:
            self._detach(self._watch)  # the next run.step is the plain one again
        self._watch = None
        if handle is None or ckpt is None:
            return
        ckpt.wait_saves(raise_errors)  # clears ``inflight``; raises the failure
        if handle.error is None:
            self._saved(Path(handle.path) if ckpt.storage.local else handle.path, handle.step)

    def _saved(self, path: Any, step: int) -> None:
        for obs in self._on_save:
            obs.on_save(path, step)

    def export(self, path: str | os.PathLike[str],
               model: nn.Module | None = None) -> Path | str:
        from splitsync.ckpt.export import export_safetensors

        if model is None:
            models = list(self.checkpointer.models.values()) if self.checkpointer else []
            if len(models) != 1:
                raise TypeError("run.export(path) exports the model registered by run.resume; "
                                f"{len(models)} are registered, so pass model=...")
            model = models[0]
        return export_safetensors(model, self._path(path), self.rank)

    def close(self, clean: bool = True) -> None:
        """Wait for the save in flight (raising its failure when ``clean``); the Checkpointer
        then frees its buffers and background group."""
        if self.checkpointer is not None:
            try:
                self.settle(wait=True, raise_errors=clean)
            finally:
                self.checkpointer.close(raise_errors=False)
