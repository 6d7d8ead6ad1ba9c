"""splitsync: one PyTorch training script for a CPU laptop, one GPU, many GPUs, many machines.

Importing is cheap: submodules (and torch) load on first use of a name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "init": "splitsync.api",
    "Run": "splitsync.runtime",
    "RunConfig": "splitsync.config",
    "DistEnv": "splitsync.env",
    "EnvError": "splitsync.env",
    "detect_env": "splitsync.env",
    "move_to": "splitsync.device",
    "seed_everything": "splitsync.seeding",
    "Throughput": "splitsync.throughput",
    "ResumeState": "splitsync.ckpt.session",
    "CheckpointError": "splitsync.ckpt.store",
    "GroupError": "splitsync.group",
    "DesyncError": "splitsync.guards.desync",
    "DeviceMismatchError": "splitsync.guards.devices",
    "ConfigMismatchError": "splitsync.guards.consistency",
    "ParameterMismatchError": "splitsync.guards.consistency",
    "CollectiveTimeoutError": "splitsync.guards.hangs",
    "Shards": "splitsync.stream.sources",
    "StaleOptimizerError": "splitsync.stale",
}

_SUBMODULES = ("testing", "launch")

__all__ = [
    "init", "Run", "RunConfig", "DistEnv", "EnvError", "detect_env", "move_to",
    "seed_everything", "Throughput", "ResumeState", "CheckpointError", "GroupError",
    "DesyncError", "DeviceMismatchError", "ConfigMismatchError", "ParameterMismatchError",
    "CollectiveTimeoutError", "StaleOptimizerError", "launch", "Shards", "__version__",
]

if TYPE_CHECKING:
    from splitsync import launch  # callable: splitsync.launch(fn, nprocs=N, args=...)
    from splitsync.ckpt.session import ResumeState
    from splitsync.ckpt.store import CheckpointError
    from splitsync.config import RunConfig
    from splitsync.guards.desync import DesyncError
    from splitsync.device import move_to
    from splitsync.env import DistEnv, EnvError, detect_env
    from splitsync.group import GroupError
    from splitsync.guards.consistency import ConfigMismatchError, ParameterMismatchError
    from splitsync.guards.devices import DeviceMismatchError
    from splitsync.guards.hangs import CollectiveTimeoutError
    from splitsync.api import init
    from splitsync.runtime import Run
    from splitsync.seeding import seed_everything
    from splitsync.stale import StaleOptimizerError
    from splitsync.stream.sources import Shards
    from splitsync.throughput import Throughput


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:  # a package's attribute is set on import; import on first use
        return importlib.import_module(f"splitsync.{name}")
    raise AttributeError(f"module 'splitsync' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
