"""The ``splitsync`` logger with a rank prefix; the root logger is never touched."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["get_logger", "attach_rank_handler", "show_repeats_once", "forget_filter"]

LOGGER_NAME = "splitsync"


def get_logger() -> logging.Logger:
    """The library's logger."""
    return logging.getLogger(LOGGER_NAME)


def attach_rank_handler(rank: int, world_size: int) -> logging.Handler:
    """Add a stderr handler that prefixes each record with the rank; returns it for removal."""
    handler = logging.StreamHandler(sys.stderr)
    prefix = f"[rank {rank}/{world_size}] " if world_size > 1 else ""
    handler.setFormatter(logging.Formatter(f"{prefix}splitsync %(levelname)s: %(message)s"))
    logger = get_logger()
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False  # keep records off the user's root handlers (no duplicates)
    return handler


def show_repeats_once() -> Callable[..., Any]:
    """Show each warning's text once per process until :func:`forget_filter`. Python's
    rule (once per code location, also under the "once" action) forgets what it showed
    whenever a filter changes, and torch changes them in code a run calls at every step or
    save (``torch.distributed.checkpoint``): a library's warning (FSDP2's "returned a view
    tensor") then came back at every step. Returns the hook to hand to forget_filter."""
    previous = warnings.showwarning
    shown: set[tuple[type, str]] = set()

    def show(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
        key = (category, str(message))
        if key not in shown:
            shown.add(key)
            previous(message, category, *args, **kwargs)

    show.previous = previous  # type: ignore[attr-defined]
    warnings.showwarning = show
    return show


def forget_filter(hook: Callable[..., Any]) -> None:
    """Put back what :func:`show_repeats_once` replaced (``run.close``), unless something
    replaced it since (then leave theirs)."""
    if warnings.showwarning is hook:
        warnings.showwarning = hook.previous  # type: ignore[attr-defined]
