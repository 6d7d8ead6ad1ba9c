"""DDP communication hooks by name; they live in :mod:`splitsync.strategies.ddp_hooks`."""

from __future__ import annotations

from splitsync.strategies.ddp_hooks import COMM_HOOKS, register_comm_hook

__all__ = ["COMM_HOOKS", "register_comm_hook"]
