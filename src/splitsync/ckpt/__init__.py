"""Checkpoints: atomic and verifiable on disk, exact resume, sharded state, safetensors export.

``run.resume``, ``run.save``, ``run.load`` and ``run.export`` go to :mod:`.checkpointer` (the run's
``Checkpointer``: registration, the step count, the one place that waits for a save). Then:

- :mod:`.save`: what a save collects, and its write (blocking, or on a background thread);
- :mod:`.find`: which checkpoint to resume from; :mod:`.load`: reading it verified, and
  loading it into the registered objects;
- :mod:`.store` (directories, manifest, commit, keep-last-k) and :mod:`.fs` (a local
  directory or an fsspec object store);
- :mod:`.integrity`: checksums, and writes and reads that check them on the way;
- :mod:`.state`: model/optimizer state for every strategy, RNG, loader positions, kinds;
- :mod:`.sharded` (torch.distributed.checkpoint), :mod:`.staging` (host copies for
  background saves), :mod:`.faults` (what went wrong), :mod:`.export` (safetensors);
- :mod:`.offline`: ``splitsync ckpt inspect``, ``convert`` and ``verify``, in one process.
"""

from __future__ import annotations

from splitsync.ckpt.checkpointer import Checkpointer, ResumeState
from splitsync.ckpt.save import SaveHandle
from splitsync.errors import CheckpointError, CheckpointWarning

__all__ = ["Checkpointer", "CheckpointError", "CheckpointWarning", "ResumeState", "SaveHandle"]
