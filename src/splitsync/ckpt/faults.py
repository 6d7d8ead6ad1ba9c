"""Saying what went wrong in a save: the cause under the wrappers, and a full disk by name.

A full disk reaches us in disguise: torch.save reports its zip writer's position mismatch
(the ``ENOSPC`` is only in ``__context__``), and ``torch.distributed.checkpoint`` raises a
``CheckpointException`` (a ``BaseException``) whose text is only the ranks that failed, with
the real errors in ``failures``. The walk below finds the innermost cause.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

__all__ = ["DISK_FULL", "causes", "is_disk_full", "describe_failure"]

DISK_FULL = "the disk is full"
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_NEARLY_FULL = 1 << 20


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything under it: causes, contexts and DCP's per-rank failures."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            for pair in failures.values():
                inner = pair[0] if isinstance(pair, tuple) else getattr(pair, "exception", pair)
                if isinstance(inner, BaseException):
                    todo.append(inner)
        for nxt in (e.__cause__, e.__context__):
            if nxt is not None:
                todo.append(nxt)


def is_disk_full(exc: BaseException) -> bool:
    """True when a write failed because the filesystem (or a quota) has no room left."""
    for e in causes(exc):
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        text = str(e).lower()
        if "no space left on device" in text or "disk quota exceeded" in text:
            return True
    return False


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _root(exc: BaseException) -> BaseException:
    """The innermost cause worth naming (an OSError if there is one)."""
    chain = list(causes(exc))
    for e in chain:
        if isinstance(e, OSError):
            return e
    return chain[-1]


def describe_failure(exc: BaseException, who: str, where: str, nbytes: int,
                     free: int | None) -> str:
    """One line for the error every rank raises: who failed where, and why in plain words.

    ``free``: bytes free on the target filesystem when the write failed. Errors that cross
    ranks inside DCP's ``CheckpointException`` are pickled, which drops ``__context__`` and
    with it the ``ENOSPC``; a write that failed with less than 1 MiB free is a full disk."""
    if is_disk_full(exc) or (free is not None and free < _NEARLY_FULL):
        need = f"; this rank had {_mb(nbytes)} to write" if nbytes else ""
        left = f", {_mb(free)} free there" if free is not None else ""
        return (f"{who} {where}: {DISK_FULL} (No space left on device){need}{left}. Free "
                "space on that filesystem, lower keep=, or save elsewhere")
    root = _root(exc)
    return f"{who} {where}: {type(root).__name__}: {str(root).strip().splitlines()[0][:300]}" \
        if str(root).strip() else f"{who} {where}: {type(root).__name__}"
