"""splitsync: one PyTorch training script for a CPU laptop, one GPU, many GPUs, many machines.

Importing is cheap: submodules (and torch) load on first use of a name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from splitsync.version import __version__

_EXPORTS = {
    "init": "splitsync.api",
    "Run": "splitsync.run.runtime",
    "RunConfig": "splitsync.run.config",
    "ResumeState": "splitsync.ckpt.checkpointer",
    "Observer": "splitsync.observe",
    "DistEnv": "splitsync.distributed.env",
    "detect_env": "splitsync.distributed.env",
    "move_to": "splitsync.distributed.device",
    "seed_everything": "splitsync.distributed.seeding",
    "Shards": "splitsync.data.stream.sources",
    "Throughput": "splitsync.output.throughput",
    # importable from the top as well, though not in __all__ (documented in the README)
    "PRECISIONS": "splitsync.run.config",
    "STRATEGY_NAMES": "splitsync.strategies",
    "gather_object": "splitsync.distributed.comm",
    "broadcast_object": "splitsync.distributed.comm",
    "PREEMPTED_EXIT_CODE": "splitsync.preemption.exit",
    **{name: "splitsync.errors" for name in (
        "CheckpointError", "EnvError", "GroupError", "DesyncError", "DeviceMismatchError",
        "ConfigMismatchError", "ParameterMismatchError", "CollectiveTimeoutError",
        "StaleOptimizerError", "CheckpointWarning", "LaunchError", "SpawnError", "Preempted")},
}

_SUBMODULES = ("testing", "launch", "errors")

# The names a script needs; everything else lives in its package (splitsync.errors holds
# every exception), and is still importable from here as listed in _EXPORTS.
__all__ = [
    "init", "Run", "RunConfig", "ResumeState", "Observer", "DistEnv", "detect_env", "move_to",
    "seed_everything", "Shards", "Throughput", "launch", "errors", "__version__",
]

if TYPE_CHECKING:  # the lazy names, for type checkers (F401 is off for this file)
    from splitsync import errors, launch  # launch is callable: splitsync.launch(fn, nprocs=N)
    from splitsync.api import init
    from splitsync.ckpt.checkpointer import ResumeState
    from splitsync.data.stream.sources import Shards
    from splitsync.distributed.comm import broadcast_object, gather_object
    from splitsync.distributed.device import move_to
    from splitsync.distributed.env import DistEnv, detect_env
    from splitsync.distributed.seeding import seed_everything
    from splitsync.errors import (
        CheckpointError,
        CheckpointWarning,
        CollectiveTimeoutError,
        ConfigMismatchError,
        DesyncError,
        DeviceMismatchError,
        EnvError,
        GroupError,
        LaunchError,
        ParameterMismatchError,
        Preempted,
        SpawnError,
        StaleOptimizerError,
    )
    from splitsync.observe import Observer
    from splitsync.output.throughput import Throughput
    from splitsync.preemption.exit import PREEMPTED_EXIT_CODE
    from splitsync.run.config import PRECISIONS, RunConfig
    from splitsync.run.runtime import Run
    from splitsync.strategies import STRATEGY_NAMES


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:  # a package's attribute is set on import; import on first use
        return importlib.import_module(f"splitsync.{name}")
    raise AttributeError(f"module 'splitsync' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*__all__, *_EXPORTS, *_SUBMODULES})
