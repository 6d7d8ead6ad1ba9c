"""Test helpers for users' own tests: run a function on N CPU ranks with gloo.

::

    from splitsync.testing import spawn

    def check(rank: int, world_size: int) -> float: ...
    results = spawn(check, world_size=2)   # [result of rank 0, result of rank 1]

The implementation lives in :mod:`splitsync.launch.spawn` (shipped code uses it from there);
this module only names it for tests.
"""

from __future__ import annotations

from splitsync.launch.spawn import (
    FORKSERVER_PRELOAD,
    LAUNCHER_PREFIXES,
    LAUNCHER_VARS,
    SpawnError,
    clean_env,
    spawn,
)

__all__ = ["spawn", "SpawnError", "clean_env", "LAUNCHER_PREFIXES", "LAUNCHER_VARS",
           "FORKSERVER_PRELOAD"]
