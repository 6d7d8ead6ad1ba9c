"""splitsync: one PyTorch training script for a CPU laptop, one GPU, many GPUs, many machines.

Importing is cheap: submodules (and torch) load on first use of a name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "init": "splitsync.api",
    "Run": "splitsync.run.runtime",
    "RunConfig": "splitsync.run.config",
    "DistEnv": "splitsync.dist.env",
    "EnvError": "splitsync.dist.env",
    "detect_env": "splitsync.dist.env",
    "move_to": "splitsync.dist.device",
    "seed_everything": "splitsync.dist.seeding",
    "Throughput": "splitsync.output.throughput",
    "ResumeState": "splitsync.ckpt.session",
    "CheckpointError": "splitsync.ckpt.store",
    "GroupError": "splitsync.dist.group",
    "DesyncError": "splitsync.tools.guards.desync",
    "DeviceMismatchError": "splitsync.tools.guards.devices",
    "ConfigMismatchError": "splitsync.tools.guards.consistency",
    "ParameterMismatchError": "splitsync.tools.guards.consistency",
    "CollectiveTimeoutError": "splitsync.tools.guards.hangs",
    "Shards": "splitsync.data.stream.sources",
    "StaleOptimizerError": "splitsync.train.stale",
    "PRECISIONS": "splitsync.run.config",
    "STRATEGY_NAMES": "splitsync.strategies",
    "Observer": "splitsync.observe",
    "gather_object": "splitsync.dist.comm",
    "broadcast_object": "splitsync.dist.comm",
}

_SUBMODULES = ("testing", "launch")

__all__ = [
    "init", "Run", "RunConfig", "DistEnv", "EnvError", "detect_env", "move_to",
    "seed_everything", "Throughput", "ResumeState", "CheckpointError", "GroupError",
    "DesyncError", "DeviceMismatchError", "ConfigMismatchError", "ParameterMismatchError",
    "CollectiveTimeoutError", "StaleOptimizerError", "launch", "Shards", "__version__",
    "PRECISIONS", "STRATEGY_NAMES", "Observer", "gather_object", "broadcast_object",
]

if TYPE_CHECKING:
    from splitsync import launch  # callable: splitsync.launch(fn, nprocs=N, args=...)
    from splitsync.api import init
    from splitsync.ckpt.session import ResumeState
    from splitsync.ckpt.store import CheckpointError
    from splitsync.data.stream.sources import Shards
    from splitsync.dist.comm import broadcast_object, gather_object
    from splitsync.dist.device import move_to
    from splitsync.dist.env import DistEnv, EnvError, detect_env
    from splitsync.dist.group import GroupError
    from splitsync.dist.seeding import seed_everything
    from splitsync.observe import Observer
    from splitsync.output.throughput import Throughput
    from splitsync.run.config import PRECISIONS, RunConfig
    from splitsync.run.runtime import Run
    from splitsync.strategies import STRATEGY_NAMES
    from splitsync.tools.guards.consistency import ConfigMismatchError, ParameterMismatchError
    from splitsync.tools.guards.desync import DesyncError
    from splitsync.tools.guards.devices import DeviceMismatchError
    from splitsync.tools.guards.hangs import CollectiveTimeoutError
    from splitsync.train.stale import StaleOptimizerError


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:  # a package's attribute is set on import; import on first use
        return importlib.import_module(f"splitsync.{name}")
    raise AttributeError(f"module 'splitsync' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
