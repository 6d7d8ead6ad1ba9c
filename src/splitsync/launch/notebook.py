"""``splitsync.launch(fn, nprocs=N, args=...)``: run a function on N local processes.

PLACEHOLDER: the entry point and its signature are fixed here so that
``splitsync.launch`` is callable; starting the processes is not implemented yet and every
call raises NotImplementedError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["notebook_launch"]


def notebook_launch(fn: Callable[..., Any], nprocs: int = 1, args: Sequence[Any] = (),
                    kwargs: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``nprocs`` local processes (not available yet)."""
    raise NotImplementedError("splitsync.launch(fn, ...) is not available yet")
