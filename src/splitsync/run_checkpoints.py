"""Run methods for checkpoints: exact resume, atomic save, safetensors export."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from splitsync.ckpt import Checkpointer, ResumeState
    from splitsync.data import DeviceLoader

__all__ = ["CheckpointMethods"]


class CheckpointMethods:
    """resume/save/export; the checkpoint machinery is imported on first use."""

    rank: int
    world_size: int
    _ckpt: Checkpointer | None
    _loaders: list[DeviceLoader]

    def resume(self, dir: str | os.PathLike[str], *, keep: int = 3, **objects: Any) -> ResumeState:
        """Register ``objects`` (model=, optimizer=, scheduler=, scaler=, ...) for
        :meth:`save` and load the newest complete checkpoint under ``dir``, if any.

        RNG states and the position of every loader made by :meth:`loader` are restored too,
        so the loop continues exactly where the checkpoint was taken. Collective.
        """
        from splitsync.ckpt import Checkpointer

        if self._ckpt is not None:
            self._ckpt.close()
        self._ckpt = Checkpointer(Path(dir), objects, keep=keep, rank=self.rank,
                                  world_size=self.world_size)
        return self._ckpt.load(self._loaders)

    def save(self, dir: str | os.PathLike[str] | None = None, *, step: int | None = None,
             epoch: int | None = None, **extra: Any) -> Path:
        """Atomically save everything registered by :meth:`resume`, plus ``extra`` (JSON or
        tensors), as ``dir/step-<step>/``; older checkpoints beyond ``keep`` are removed.
        Collective: call it on every rank."""
        if self._ckpt is None:
            raise RuntimeError("run.save() saves the objects registered by run.resume(dir, "
                               "model=..., optimizer=...); call run.resume first.")
        root = self._ckpt.root if dir is None else Path(dir)
        return self._ckpt.save(root, self._loaders, step=step, epoch=epoch, extra=extra)

    def export(self, path: str | os.PathLike[str], model: nn.Module | None = None) -> Path:
        """Write the model's final weights to ``path`` as one unsharded safetensors file."""
        from splitsync.ckpt.export import export_safetensors

        if model is None:
            models = list(self._ckpt.models.values()) if self._ckpt is not None else []
            if len(models) != 1:
                raise TypeError("run.export(path) exports the model registered by run.resume; "
                                f"{len(models)} are registered, so pass model=...")
            model = models[0]
        return export_safetensors(model, path, self.rank)
