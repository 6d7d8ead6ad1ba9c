"""Desync forensics (debug mode); lives in :mod:`splitsync.guards.desync`, re-exported here."""

from __future__ import annotations

from splitsync.guards.desync import (
    COLLECTIVES,
    Call,
    DesyncError,
    Recorder,
    debug_from_environ,
)

__all__ = ["DesyncError", "Call", "Recorder", "COLLECTIVES", "debug_from_environ"]
