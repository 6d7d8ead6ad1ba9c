"""No wrapper at all: one process, one device. The fastest path at world size 1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from splitsync.strategies import Strategy, WrapContext


def _wrap(module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
    return module


STRATEGY = Strategy(name="single", wrap=_wrap)
