"""Every benchmark loop by its kind: splitsync's, hand-written and other toolkits' loops."""

from __future__ import annotations

from typing import Any

from torch import nn

from splitsync.bench import otherloops
from splitsync.bench.loops import LOOP_BUILDERS, Loop
from splitsync.bench.workloads import Workload

__all__ = ["OTHER_LOOPS", "build_loop"]

OTHER_LOOPS = tuple(otherloops.BUILDERS)  # accelerate, fabric, dp (toolkits load on setup)


def build_loop(kind: str, wl: Workload, base: nn.Module, ctx: dict[str, Any]) -> Loop:
    """Instantiate the loop called ``kind`` on its own copy of ``base``."""
    builders: dict[str, type[Loop]] = {**LOOP_BUILDERS, **otherloops.BUILDERS}
    return builders[kind](wl, base, ctx)
