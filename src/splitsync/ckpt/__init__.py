"""Checkpoints: atomic and verifiable on disk, exact resume, sharded state, safetensors export.

``run.resume``, ``run.save`` and ``run.export`` are the entry points; this package holds the
pieces: :mod:`.store` (directories, manifest, keep-last-k), :mod:`.fs` (local directory or
fsspec object store), :mod:`.saving` and :mod:`.background` (staging, background writes),
:mod:`.chunked` and :mod:`.reading` (checksummed I/O, verified resume), :mod:`.state` (RNG,
loaders, optimizer naming), :mod:`.sharded` (torch.distributed.checkpoint), :mod:`.export`.
"""

from __future__ import annotations

from splitsync.ckpt.background import SaveHandle
from splitsync.ckpt.session import Checkpointer, CheckpointWarning, ResumeState
from splitsync.ckpt.store import CheckpointError

__all__ = ["Checkpointer", "CheckpointError", "CheckpointWarning", "ResumeState", "SaveHandle"]
