"""The ``splitsync`` logger with a rank prefix; the root logger is never touched."""

from __future__ import annotations

import logging
import sys

__all__ = ["get_logger", "attach_rank_handler"]

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
