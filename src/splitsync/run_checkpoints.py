"""The run's checkpoint part: exact resume, atomic save, safetensors export.

The checkpoint machinery (``splitsync.ckpt``) is imported on first use.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from splitsync.observe import Observer, overriding, redirect
from splitsync.run_data import Loaders

if TYPE_CHECKING:
    from splitsync.ckpt import Checkpointer, ResumeState

__all__ = ["Checkpoints"]


class Checkpoints:
    """resume/save/export for one run; ``checkpointer`` is None until ``resume``."""

    def __init__(self, rank: int, world_size: int, loaders: Loaders) -> None:
        self.rank = rank
        self.world_size = world_size
        self.loaders = loaders
        self.checkpointer: Checkpointer | None = None
        self._on_save: tuple[Observer, ...] = ()
        self._redirect: tuple[Observer, ...] = ()

    def set_observers(self, observers: Sequence[Observer]) -> None:
        self._on_save = overriding(observers, "on_save")
        self._redirect = overriding(observers, "redirect_path")

    def _path(self, path: str | os.PathLike[str]) -> Path:
        return redirect(self._redirect, Path(path))

    def resume(self, dir: str | os.PathLike[str], *, keep: int = 3, **objects: Any) -> ResumeState:
        from splitsync.ckpt import Checkpointer

        if self.checkpointer is not None:
            self.checkpointer.close()
        self.checkpointer = Checkpointer(self._path(dir), objects, keep=keep, rank=self.rank,
                                         world_size=self.world_size)
        return self.checkpointer.load(self.loaders.all)

    def attach_loader(self, loader: Any) -> None:
        """A loader made after ``resume`` continues where the checkpoint left it."""
        if self.checkpointer is not None:
            self.checkpointer.attach_loader(loader, len(self.loaders.all) - 1)

    def save(self, dir: str | os.PathLike[str] | None = None, *, step: int | None = None,
             epoch: int | None = None, **extra: Any) -> Path:
        ckpt = self.checkpointer
        if ckpt is None:
            raise RuntimeError("run.save() saves the objects registered by run.resume(dir, "
                               "model=..., optimizer=...); call run.resume first.")
        root = ckpt.root if dir is None else self._path(dir)
        path = ckpt.save(root, self.loaders.all, step=step, epoch=epoch, extra=extra)
        for obs in self._on_save:
            obs.on_save(path, ckpt.step if step is None else step)
        return path

    def export(self, path: str | os.PathLike[str], model: nn.Module | None = None) -> Path:
        from splitsync.ckpt.export import export_safetensors

        if model is None:
            models = list(self.checkpointer.models.values()) if self.checkpointer else []
            if len(models) != 1:
                raise TypeError("run.export(path) exports the model registered by run.resume; "
                                f"{len(models)} are registered, so pass model=...")
            model = models[0]
        return export_safetensors(model, self._path(path), self.rank)

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
