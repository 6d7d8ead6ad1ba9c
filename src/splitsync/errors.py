"""Errors shared by layers that must not import each other (checkpoints and strategies)."""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or does not fit what it should be loaded into."""
