"""No wrapper at all: one process, one device. The fastest path at world size 1."""

from __future__ import annotations

from splitsync.strategies.base import Strategy


class Single(Strategy):
    """The module as it is; every default of :class:`Strategy` applies."""

    name = "single"


STRATEGY = Single()
