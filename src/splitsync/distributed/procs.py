"""The processes a process forked, read from Linux's /proc (the launcher's cleanup and a
rank's forced exit both need them)."""

from __future__ import annotations

import os

__all__ = ["children"]


def children(pid: int) -> list[int]:
    """The processes ``pid`` forked, from any of its threads (none where there is no /proc)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return found
