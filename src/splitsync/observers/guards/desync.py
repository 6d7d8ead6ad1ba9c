"""Desync forensics (debug mode): every rank records its collective calls and checks them.

``splitsync.init(debug=True)`` (or ``SPLITSYNC_DEBUG=1``) patches the collectives of
``torch.distributed`` for the life of the run (restored by ``run.close()``; nothing is patched
otherwise). Before each call on the default group, the ranks all-gather a hash of
(op, shapes and dtypes, user's file:line) on a side gloo group. If the hashes differ, the ranks
swap their recent calls and every rank raises the same :class:`DesyncError`, naming the rank
that diverged, the call number and where in the user's code each rank was. A rank that never
arrives is named by the hang guard within the timeout. Costs two small gloo collectives per
call: a debugging tool, off by default.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from splitsync.errors import DesyncError
from splitsync.observe import Observer
from splitsync.observers.guards.consistency import reference_ranks
from splitsync.observers.guards.hangs import Position, explain_failure, is_comm_failure
from splitsync.observers.guards.site import user_site

__all__ = ["DesyncError", "Call", "Recorder", "COLLECTIVES", "debug_from_environ"]

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "reduce", "gather", "scatter", "all_to_all",
    "all_to_all_single", "barrier", "all_gather_object", "broadcast_object_list",
    "gather_object", "scatter_object_list",
)
_TAIL = 6  # calls shown per rank in the error


def debug_from_environ(environ: dict[str, str] | Any) -> bool:
    """``SPLITSYNC_DEBUG=1`` turns debug mode on without editing the script."""
    return str(environ.get("SPLITSYNC_DEBUG", "")).strip().lower() in ("1", "true", "yes", "on")


def _describe_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Shapes and dtypes of the first argument only: it is the same kind on every rank for
    every collective (the root's extra list in gather/scatter differs by design)."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    items = first if isinstance(first, (list, tuple)) else [first]
    parts = []
    for t in items:
        if isinstance(t, torch.Tensor):
            parts.append(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}")
    return ", ".join(parts)


@dataclass(frozen=True)
class Call:
    """One recorded collective call."""

    index: int
    op: str
    shapes: str
    site: str

    def text(self) -> str:
        return f"#{self.index} {self.op}({self.shapes}) at {self.site}"

    def key(self) -> str:
        return f"{self.op}({self.shapes}) at {self.site}"


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


class Recorder(Observer):
    """Records and cross-checks this rank's collective calls while installed.

    As a run observer it does its last check when the run closes cleanly (a rank with extra
    calls is caught there) and then restores ``torch.distributed``.
    """

    def __init__(self, rank: int, world: int, side_group: Any, timeout: timedelta,
                 store: Any | None) -> None:
        self.rank = rank
        self.world = world
        self.side_group = side_group
        self.timeout = timeout
        self.store = store
        self.calls: list[Call] = []
        self._saved: dict[str, Callable[..., Any]] = {}

    # --- patching ------------------------------------------------------------------------
    def install(self) -> None:
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is not None:
                self._saved[name] = original
                setattr(dist, name, self._wrap(name, original))

    def uninstall(self) -> None:
        """Put back every function this recorder replaced (only if still ours)."""
        for name, original in self._saved.items():
            current = getattr(dist, name, None)
            if getattr(current, "__splitsync_recorder__", None) is self:
                setattr(dist, name, original)
        self._saved.clear()

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group")
            if group is None or group is c10d.GroupMember.WORLD:
                self.record(name, _describe_args(args, kwargs), user_site())
            return original(*args, **kwargs)

        wrapper.__splitsync_recorder__ = self  # type: ignore[attr-defined]
        return wrapper

    # --- checking ------------------------------------------------------------------------
    def history(self) -> tuple[str, ...]:
        return tuple(c.text() for c in self.calls[-_TAIL:])

    def record(self, op: str, shapes: str, site: str) -> None:
        """Append one call and check that every rank makes the same one."""
        call = Call(len(self.calls) + 1, op, shapes, site)
        self.calls.append(call)
        self.check(call)

    def finish(self, site: str) -> None:
        """Called by a normal run.close(): a rank with extra calls is caught here."""
        self.record("close", "", site)

    def on_close(self, clean: bool) -> None:
        try:
            if clean:
                self.finish(user_site())
        finally:
            self.uninstall()

    def check(self, call: Call) -> None:
        mine = torch.tensor([_hash(call.key())], dtype=torch.int64)
        parts = [torch.zeros_like(mine) for _ in range(self.world)]
        try:
            c10d.all_gather(parts, mine, group=self.side_group)
        except Exception as exc:
            if not is_comm_failure(exc):
                raise
            me = Position(self.rank, call.index, call.op, call.site, self.history())
            raise explain_failure(exc, me, self.world, self.timeout, self.store) from exc
        hashes = [int(p.item()) for p in parts]
        if len(set(hashes)) == 1:
            return
        tails: list[Any] = [None] * self.world
        c10d.all_gather_object(tails, [c.text() for c in self.calls[-_TAIL:]],
                               group=self.side_group)
        raise self._error(call, hashes, tails)

    def _error(self, call: Call, hashes: list[int], tails: list[Any]) -> DesyncError:
        ref = reference_ranks(hashes)
        diverged = sorted(set(range(self.world)) - ref)
        lines = [f"Ranks are out of sync at collective call #{call.index}: rank(s) {diverged} "
                 f"diverged from rank(s) {sorted(ref)}. Where each rank is:"]
        for r, tail in enumerate(tails):
            mark = "   <- diverged" if r in diverged else ""
            lines.append(f"  rank {r}: {tail[-1] if tail else '?'}{mark}")
        lines.append("Recent calls on each rank (oldest first):")
        for r, tail in enumerate(tails):
            lines.append(f"  rank {r}: " + " | ".join(tail or ["none"]))
        lines.append(
            "Fix: every rank must make the same collective calls, with the same shapes, from "
            "the same line, in the same order. Look for collectives under `if run.rank == ...` "
            "or `if run.is_main`, loops whose length differs between ranks (uneven data: use "
            "run.loader), and tensors whose shape depends on the rank's data."
        )
        return DesyncError("\n".join(lines), diverged, call.index)
