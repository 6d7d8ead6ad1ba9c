"""Hang guard: a collective that fails or times out names the ranks that never arrived.

Nothing is sent while things go well: each rank only counts its own collective calls. When a
call fails (timeout, peer gone), the rank posts where it stands to the job's store and reads
what the other ranks posted within a short grace period. A rank that posted nothing never
reached any splitsync collective; a rank that posted another call is out of step.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from splitsync.distributed.rankstate import write_state
from splitsync.errors import CollectiveTimeoutError
from splitsync.observers.guards.responder import ask_everyone, position_key, start_responder
from splitsync.observers.guards.site import user_site

__all__ = [
    "CollectiveTimeoutError", "Position", "Watch", "is_comm_failure", "explain_failure",
    "default_store", "split_timeout", "post_process", "fate_of",
]

T = TypeVar("T")
_PROCESS = "splitsync/guards/process/{rank}"
_FAILURE_WORDS = ("timed out", "timeout", "connection closed", "connection reset",
                  "broken pipe", "monitoredbarrier", "connection refused", "peer")
_POLL_S = 0.05


@dataclass(frozen=True)
class Position:
    """Where a rank stands: its n-th collective call, which op, from which line of user code."""

    rank: int
    call: int
    op: str
    site: str
    history: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"call #{self.call} {self.op} at {self.site}"


def is_comm_failure(exc: BaseException) -> bool:
    """True for errors a stuck or vanished peer produces (timeouts, closed connections)."""
    if type(exc).__module__.startswith("splitsync"):
        return False  # already explained (desync, config, parameter errors)
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(w in text for w in _FAILURE_WORDS)


def split_timeout(timeout: timedelta) -> tuple[timedelta, float]:
    """(how long a collective waits, grace to find the missing ranks): they add up to the
    user's timeout, so the error arrives within it. Grace: 10% of it, 0.5 to 10 seconds."""
    total = timeout.total_seconds()
    grace = min(10.0, max(0.5, total / 10), total / 2)
    return timedelta(seconds=total - grace), grace


def _read_positions(store: Any, world: int, me: Position, grace: float) -> dict[int, Position]:
    seen = {me.rank: me}
    deadline = time.monotonic() + grace
    while len(seen) < world and time.monotonic() < deadline:
        for r in range(world):
            key = position_key(r)
            if r not in seen and store.check([key]):
                seen[r] = _decode(store.get(key))
        time.sleep(_POLL_S)
    return seen


def _decode(raw: bytes) -> Position:
    data = json.loads(raw)
    data["history"] = tuple(data.get("history", ()))
    return Position(**data)


_CLOSED_WORDS = ("connection closed", "connection reset", "broken pipe", "closed by peer",
                 "connection refused", "end of file")


def _what_happened(exc: BaseException, me: Position, timeout: timedelta,
                   elapsed: float | None) -> str:
    """The first line: a peer that closed its connection is not a timeout, and the time
    that passed is the real one."""
    text = str(exc).strip()
    detail = f"({type(exc).__name__}: {text[:200]})"
    after = f" after {elapsed:.1f}s" if elapsed is not None else ""
    if any(w in text.lower() for w in _CLOSED_WORDS):
        return (f"Rank {me.rank}: collective {me.describe()} failed{after}: a peer closed the "
                f"connection (its process crashed, was killed or exited) {detail}.")
    if elapsed is not None and elapsed < 0.9 * timeout.total_seconds():
        return (f"Rank {me.rank}: collective {me.describe()} failed{after}, before the "
                f"{timeout.total_seconds():g}s timeout {detail}.")
    return (f"Rank {me.rank}: collective {me.describe()} did not complete within the "
            f"{timeout.total_seconds():g}s timeout{after and f' ({after.strip()})'} {detail}.")


def post_process(store: Any | None, rank: int) -> None:
    """Where this rank's process runs (host, pid), for a peer to tell its death apart."""
    if store is None:
        return
    with contextlib.suppress(Exception):  # a message's detail: never a reason to fail
        store.set(_PROCESS.format(rank=rank), f"{socket.gethostname()} {os.getpid()}")


def fate_of(store: Any | None, rank: int) -> str | None:
    """How rank ``rank``'s process ended, when it runs on this host and is gone: "exit
    code N", "signal SIGKILL", "exited" (already reaped); None when alive or unknown."""
    if store is None:
        return None
    try:
        key = _PROCESS.format(rank=rank)
        if not store.check([key]):
            return None
        host, pid = store.get(key).decode().split()
    except Exception:
        return None
    if host != socket.gethostname():
        return None
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except FileNotFoundError:
        return "exited"  # its parent already collected it
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] != "Z":  # alive (or another process reused the pid)
        return None
    code = int(fields[49]) if len(fields) >= 50 and fields[49].isdigit() else None
    if code is None:
        return "exited"
    if code & 0x7F:
        try:
            return f"signal {signal.Signals(code & 0x7F).name}"
        except ValueError:
            return f"signal {code & 0x7F}"
    return f"exit code {code >> 8}"


def explain_failure(exc: BaseException, me: Position, world: int, timeout: timedelta,
                    store: Any | None, post: Position | None = None,
                    elapsed: float | None = None) -> CollectiveTimeoutError:
    """Post this rank's position (``post``: where it first failed, if earlier than ``me``),
    gather the others', and build the error to raise. ``elapsed``: seconds the call ran."""
    grace = split_timeout(timeout)[1]
    seen: dict[int, Position] = {me.rank: me}
    note = ""
    if store is not None:
        try:
            store.set(position_key(me.rank), json.dumps(asdict(post or me)))
            ask_everyone(store, world, me.rank)  # ranks blocked elsewhere answer at once
            seen = _read_positions(store, world, me, grace)
        except Exception as store_exc:  # the store lives in a rank or agent that may be gone
            note = f"\n  (could not reach the other ranks through the job's store: {store_exc})"
    missing = [r for r in range(world) if r not in seen]
    if missing and any(w in str(exc).lower() for w in _CLOSED_WORDS):
        return _died(exc, me, missing, timeout, elapsed, store, note)
    key = {r: (p.call, p.op) for r, p in seen.items()}
    mine = key[me.rank]
    out_of_step = sorted(r for r in seen if key[r] != mine)
    lines = [_what_happened(exc, me, timeout, elapsed)]
    for r in missing:
        lines.append(f"  rank {r} never arrived: it is not waiting in any splitsync collective "
                     f"(it skipped this call, is stuck in its own code, or has exited).")
    for r in out_of_step:
        lines.append(f"  rank {r} is at {seen[r].describe()} instead: the ranks are out of step "
                     "(a rank skipped or added a collective before this point).")
    if not missing and not out_of_step and len(seen) == world:
        lines.append("  every rank reached this same call, so the failure is in the network or "
                     "the backend, not in the order of calls.")
    if me.history:
        for r in sorted(seen):
            tail = " | ".join(seen[r].history[-4:]) or "none"
            lines.append(f"  rank {r} last calls: {tail}")
    lines.append(
        "Fix: every rank must make the same collective calls in the same order: look for "
        "run.mean/gather/barrier (or torch.distributed calls) under `if run.rank == ...`, in "
        "loops whose length differs between ranks, or after an early `break`. "
        + ("" if me.history else "Rerun with splitsync.init(debug=True) (or SPLITSYNC_DEBUG=1) "
           "to record every rank's calls and see where they diverge. ")
        + "Raise init(timeout=...) if a rank legitimately works longer between collectives."
    )
    return CollectiveTimeoutError("\n".join(lines) + note, missing, out_of_step)


def _died(exc: BaseException, me: Position, missing: list[int], timeout: timedelta,
          elapsed: float | None, store: Any | None, note: str) -> CollectiveTimeoutError:
    """A peer closed its connection and never posted: it died. Not a desync: no advice on
    the order of calls, which was not the cause."""
    lines = [_what_happened(exc, me, timeout, elapsed)]
    for r in missing:
        fate = fate_of(store, r)
        how = f" ({fate})" if fate else " (its exit code or signal: in the launcher's report)"
        lines.append(f"  rank {r} died{how}.")
    who = ", ".join(str(r) for r in missing)
    lines.append(f"Fix: see why rank(s) {who} died, in their own output above; this rank "
                 "only lost its peer. Relaunching resumes from the last checkpoint.")
    return CollectiveTimeoutError("\n".join(lines) + note, missing, [])


class Watch:
    """Per-run hang guard: counts this rank's collectives and explains a failed one."""

    def __init__(self, rank: int, world: int, timeout: timedelta, side_group: Any,
                 store: Any | None, desync_after: float | None = None,
                 folder: str | None = None, dump_file: str | None = None) -> None:
        self.rank = rank
        self.world = world
        self.timeout = timeout
        self.side_group = side_group
        self.store = store
        self.folder = folder  # the launcher's state folder (rankstate), if any
        self.calls = 0
        self.op = ""  # the op of the call in progress (read by the responder thread)
        self.in_call = False
        self.started = 0.0  # when the call in progress started (read by the long-wait check)
        self.args: tuple[Any, ...] = ()  # its arguments: shapes are described only if it hangs
        # Where this rank first failed: the point of divergence. Later failures (e.g. the
        # barrier in close()) are its consequences, so peers are told this one.
        self.first_failure: Position | None = None
        self.recorder: Any | None = None  # debug mode's desync.Recorder, if on
        self._owner = threading.get_ident()  # the loop's thread: only its calls are counted
        self._waits: Any | None = None
        self._responder: Any | None = None
        if desync_after is not None and store is not None:
            from splitsync.observers.guards.waits import LongWaits

            self._waits = LongWaits(self, store, desync_after, folder, dump_file)
            self._responder = self._waits.responder
        else:
            self._responder = start_responder(store, rank, self._position_now)
        post_process(store, rank)

    def call(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        """Run one collective; on a communication failure raise a CollectiveTimeoutError.

        Calls from another thread (a background checkpoint's handshakes, on a group of their
        own) are explained but not counted: their order relative to the loop's calls differs
        from rank to rank, so counting them would make ranks look out of step."""
        start = time.monotonic()
        if threading.get_ident() != self._owner:
            try:
                return fn(*args)
            except Exception as exc:
                if not is_comm_failure(exc):
                    raise
                history = self.recorder.history() if self.recorder is not None else ()
                me = Position(self.rank, self.calls, f"{op} (background)", user_site(), history)
                raise explain_failure(exc, me, self.world, self.timeout, None,
                                      elapsed=time.monotonic() - start) from exc
        self.calls += 1
        self.op = op
        self.started = start
        self.args = args
        self.in_call = True
        try:
            return fn(*args)
        except Exception as exc:
            if not is_comm_failure(exc):
                raise
            raise self.explain(exc, op, elapsed=time.monotonic() - start) from exc
        finally:
            self.in_call = False
            self.args = ()

    def _position_now(self, site: str) -> Position | None:
        """Where the main thread stands, for a peer that asks; None outside a collective."""
        if self.first_failure is not None:
            return self.first_failure
        if not self.in_call:
            return None
        history = self.recorder.history() if self.recorder is not None else ()
        return Position(self.rank, self.calls, self.op, site, history)

    def close(self) -> None:
        """Stop the responder thread (and the long-wait check's)."""
        if self._waits is not None:
            self._waits.closing(user_site())
            self._waits.close()
            self._waits = None
        if self._responder is not None:
            self._responder.close()
            self._responder = None

    def explain(self, exc: BaseException, op: str, counted: bool = True,
                elapsed: float | None = None) -> CollectiveTimeoutError:
        """``counted=False``: a call that communicates only sometimes (DDP's forward); it is
        reported as the next call without shifting the count."""
        history = self.recorder.history() if self.recorder is not None else ()
        me = Position(self.rank, self.calls + (0 if counted else 1), op, user_site(), history)
        first = self.first_failure
        if first is None:
            self.first_failure = me
            # for the launcher's summary, before the grace below (it may stop this rank)
            write_state(self.folder, self.rank, {
                "rank": self.rank, "state": "failed", "call": me.call, "op": op,
                "site": me.site, "error": f"{type(exc).__name__}: {str(exc)[:200]}"},
                keep=True)
        return explain_failure(exc, me, self.world, self.timeout, self.store, first, elapsed)

    def barrier(self) -> None:
        """A monitored barrier on the side gloo group: names every rank that did not arrive."""
        if self.recorder is not None:
            self.recorder.record("barrier", "", user_site())
        wait = split_timeout(self.timeout)[0]
        self.call("barrier", dist.monitored_barrier, self.side_group, wait, True)


def default_store() -> Any | None:
    """The store the default group was formed with (None if PyTorch hides it)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # private accessor: degrade to a message without the others' positions
        return None
