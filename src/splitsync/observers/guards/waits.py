"""Out of step, found while waiting: a rank that has waited ``desync_after`` seconds in one
collective asks the others where they are, and stops the job if they are elsewhere.

Nothing happens on the fast path: the hang watch only notes when a call started (one clock
read it already made). One thread per rank wakes once a second and looks at that note; a
call that ends in time is never seen. Past ``desync_after``, the waiting rank asks every
other rank's responder through the job's store (no new server) and judges:

- every rank waits in the same call with the same shapes: the job is slow, not out of step.
  One line says which rank arrived last; the call waits on until ``timeout``.
- a rank is at another call, in the same call with other shapes, running outside any
  collective (it has not reached this one for ``desync_after`` seconds), or did not answer
  (it has exited or is frozen): the ranks are out of step for certain. The first rank to see
  it prints one summary (each rank, its state, its line in the user's code, its stack when it
  is running, the DataLoader worker it waits for) and every rank stops (exit code 1), since a
  rank blocked inside a gloo or NCCL call cannot be made to return and raise.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from splitsync.distributed.rankstate import write_state
from splitsync.observers.guards.responder import (
    GENERATION_KEY,
    VERDICT_KEY,
    report_key,
    start_responder,
    wake_key,
)
from splitsync.observers.guards.site import user_site
from splitsync.observers.guards.stacks import (
    fork_note,
    loader_worker,
    stack_lines,
    stop_children,
    stuck_in_fork,
    worker_site,
    worker_stack,
)

__all__ = ["DEFAULT_DESYNC_AFTER", "DESYNC_AFTER_VAR", "OUT_OF_STEP_EXIT_CODE", "LongWaits",
           "judge", "summary", "desync_after_from"]

#: Seconds a rank waits in one collective before it checks where the others are.
DEFAULT_DESYNC_AFTER = 20.0
DESYNC_AFTER_VAR = "SPLITSYNC_DESYNC_AFTER"
OUT_OF_STEP_EXIT_CODE = 1
_GO = b"go"  # a wake that asks for a report; the value itself is not read
_COUNT_KEY = "splitsync/guard/verdicts"
_STOPPED_KEY = "splitsync/guard/stopped"
_SLOW_KEY = "splitsync/guard/slow"
_CLOSED_KEY = "splitsync/guard/closed/{rank}"  # a rank in run.close(): its responder is gone
_POLL_S = 0.05


def desync_after_from(value: float | None, environ: Any) -> float:
    """``init(desync_after=...)``, else ``SPLITSYNC_DESYNC_AFTER``, else the default; checked."""
    raw: Any = value
    if raw is None:
        raw = environ.get(DESYNC_AFTER_VAR) or DEFAULT_DESYNC_AFTER
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(raw, bool) or not seconds > 0:
        raise ValueError(f"desync_after={raw!r}: give the seconds a rank waits in one "
                         f"collective before it checks where the others are (a number > 0; "
                         f"default {DEFAULT_DESYNC_AFTER:g}).")
    return seconds


def _shapes(args: tuple[Any, ...]) -> str:
    """Shapes and dtypes of a collective's tensor arguments (read only on the slow path)."""
    parts = []
    for a in args:
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor):
                parts.append(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}")
    return ", ".join(parts)


def _line(s: dict[str, Any]) -> str:
    """One rank's state in words."""
    rank = s["rank"]
    if s["state"] == "waiting":
        shapes = f"({s['shapes']})" if s.get("shapes") else ""
        return (f"rank {rank}: waiting in call #{s['call']} {s['op']}{shapes} at {s['site']} "
                f"for {s['waited']:.1f}s")
    if s["state"] == "failed":
        return f"rank {rank}: failed at call #{s['call']} {s['op']} at {s['site']}"
    if s["state"] == "closing":
        return (f"rank {rank}: left its loop after call #{s['call']}: it is closing the run "
                f"at {s['site']}")
    return (f"rank {rank}: running at {s['site']}, outside any collective (its last was "
            f"call #{s['call']})")


def judge(states: dict[int, dict[str, Any]], world: int, me: int) -> list[str]:
    """Why the ranks are out of step (empty: they are in step, only slow). In a barrier, a
    rank still running is not a sign: a barrier exists to wait for such work (rank 0 alone
    downloading or saving under ``run.main_process_first``)."""
    mine = states[me]
    in_barrier = "barrier" in str(mine.get("op", ""))
    reasons = []
    for r in range(world):
        s = states.get(r)
        if s is None:
            reasons.append(f"rank {r} did not answer: it has exited or is frozen")
        elif s["state"] == "closing":
            reasons.append(f"rank {r} has left its loop (it is in run.close())")
        elif s["state"] == "running":
            if not in_barrier:
                reasons.append(f"rank {r} has not reached any collective for "
                               f"{mine['waited']:.0f}s")
        elif (s["call"], s["op"]) != (mine["call"], mine["op"]) or s["state"] == "failed":
            reasons.append(f"rank {r} is at call #{s['call']} {s['op']}, rank {me} at call "
                           f"#{mine['call']} {mine['op']}")
        elif s.get("shapes", "") != mine.get("shapes", ""):
            reasons.append(f"rank {r} passes {s.get('shapes') or 'no tensor'}, rank {me} "
                           f"passes {mine.get('shapes') or 'no tensor'} to the same call")
    return reasons


def summary(states: dict[int, dict[str, Any]], world: int, reasons: list[str], waited: float,
            timeout_s: float) -> str:
    """The out-of-step error every rank stops with: each rank, its state, its line."""
    lines = [f"The ranks are out of step (found after {waited:.1f}s of waiting, not at the "
             f"{timeout_s:g}s timeout): {'; '.join(reasons)}."]
    for r in range(world):
        s = states.get(r)
        if s is None:
            lines.append(f"  rank {r}: no answer (exited or frozen)")
            continue
        lines.append(f"  {_line(s)}")
        if s["state"] == "running" and s.get("stack"):
            lines.append("      stack (most recent last): " + " <- ".join(reversed(s["stack"])))
        worker = s.get("worker")
        if worker:
            lines.append(f"      rank {r} waits for its DataLoader worker {worker['id']} "
                         f"(pid {worker['pid']}), which has not delivered the next batch: it "
                         f"is at {worker.get('site', '?')}; its stack (most recent first):")
            lines.extend(f"        {f}" for f in worker.get("stack") or ["(no dump came)"])
            if stuck_in_fork(worker.get("stack") or []):
                lines.append(f"      {fork_note(r)}")
    if any("passes" in r for r in reasons):
        lines.append("The ranks made different collective calls: the same collective was "
                     "given tensors of different shapes or dtypes on different ranks, so the "
                     "ranks would exchange mismatched data (gloo aborts, NCCL hangs or "
                     "corrupts memory).")
    elif any(" is at call " in r for r in reasons):
        lines.append("The ranks made different collective calls: their calls no longer pair "
                     "up (a call with other shapes can even complete on one rank and leave "
                     "the other waiting, as here).")
    lines.append(
        "Fix: every rank must make the same collective calls in the same order, with the "
        "same shapes: look for run.mean/gather/barrier (or torch.distributed calls) under "
        "`if run.rank == ...`, in loops whose length differs between ranks, or after an "
        "early `break`. If a rank legitimately works alone longer than desync_after while "
        "the others wait, raise init(desync_after=...) (or SPLITSYNC_DESYNC_AFTER).")
    return "\n".join(lines)


class LongWaits:
    """One rank's long-wait check: a thread that watches the hang watch's call in progress,
    and the responder that answers the other ranks' checks."""

    def __init__(self, watch: Any, store: Any, desync_after: float, folder: str | None,
                 dump_file: str | None,
                 exit_process: Callable[[int], None] = os._exit) -> None:
        self.watch = watch  # hangs.Watch: rank, world, calls, op, in_call, started, args
        self.store = store
        self.desync_after = desync_after
        self.folder = folder  # the launcher's state folder, if any
        self.dump_file = dump_file  # where this process's faulthandler dumps go
        self._exit = exit_process
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._stopping = threading.Lock()
        self._checked = 0  # the last call checked: each call is judged once...
        self._recheck_at = 0.0  # ...unless a barrier waits on ranks still running
        self._worker: dict[str, Any] | None = None  # the last DataLoader worker dumped
        self.responder = start_responder(store, watch.rank, watch._position_now,
                                         self.report, self.on_verdict)
        self._thread = threading.Thread(target=self._loop, name="splitsync-guard-waits",
                                        daemon=True)
        self._thread.start()

    # --- this rank's state ---------------------------------------------------------------
    def _frame(self) -> Any:
        return sys._current_frames().get(self._main) if self._main is not None else None

    def report(self, frame: Any = None) -> dict[str, Any]:
        """Where this rank stands now, for a peer's check (called from the responder too)."""
        w = self.watch
        frame = frame if frame is not None else self._frame()
        site = user_site(frame) if frame is not None else "?"
        state: dict[str, Any] = {"rank": w.rank, "call": w.calls, "op": w.op, "site": site}
        first = w.first_failure
        if first is not None:
            state.update(state="failed", call=first.call, op=first.op, site=first.site)
        elif w.in_call:
            state.update(state="waiting", shapes=_shapes(w.args),
                         waited=time.monotonic() - w.started)
        else:
            state.update(state="running", stack=stack_lines(frame))
            found = loader_worker(frame)
            if found is not None:
                wid, pid = found
                known = self._worker
                if known is None or known["pid"] != pid:  # one dump per worker is enough
                    frames = worker_stack(pid, self.dump_file)
                    known = {"id": wid, "pid": pid, "stack": frames,
                             "site": worker_site(frames)}
                    self._worker = known
                state["worker"] = known
        return state

    # --- the check -----------------------------------------------------------------------
    def _loop(self) -> None:
        poll = min(1.0, self.desync_after / 4)
        while not self._stop.wait(poll):
            w = self.watch
            now = time.monotonic()
            if not w.in_call or now - w.started < self.desync_after:
                continue
            if w.calls == self._checked and not (self._recheck_at and now >= self._recheck_at):
                continue
            self._checked, self._recheck_at = w.calls, 0.0
            try:
                self.check()
            except Exception:  # the store went away: the collective's own error explains
                return

    def check(self) -> None:
        """Ask every rank where it is; stop the job if they are out of step."""
        w = self.watch
        generation = int(self.store.add(GENERATION_KEY, 1))
        for r in range(w.world):
            if r != w.rank:
                self.store.set(wake_key(r), _GO)
        states = {w.rank: self.report()}
        mine = states[w.rank]
        if mine["state"] != "waiting":
            return  # the call ended meanwhile
        grace = min(10.0, max(2.0, self.desync_after / 2))
        deadline = time.monotonic() + grace
        while len(states) < w.world and time.monotonic() < deadline:
            for r in range(w.world):
                if r in states:
                    continue
                if self.store.check([report_key(r)]):
                    s = json.loads(self.store.get(report_key(r)))
                    if s.get("generation", -1) >= generation:
                        states[r] = s
                        continue
                if self.store.check([_CLOSED_KEY.format(rank=r)]):  # no responder left
                    states[r] = json.loads(self.store.get(_CLOSED_KEY.format(rank=r)))
            if self.store.check([VERDICT_KEY]):
                self.on_verdict(self.store.get(VERDICT_KEY).decode())
            time.sleep(_POLL_S)
        if not w.in_call or w.calls != mine["call"]:
            return  # the collective completed while we asked: in step after all
        reasons = judge(states, w.world, w.rank)
        if not reasons:
            if any(st["state"] == "running" for st in states.values()):
                self._recheck_at = time.monotonic() + self.desync_after  # a barrier waits
            else:
                self._say_slow(states, mine)
            return
        text = summary(states, w.world, reasons, mine["waited"], w.timeout.total_seconds())
        if int(self.store.add(_COUNT_KEY, 1)) == 1:
            self.store.set(VERDICT_KEY, text)
            print(f"splitsync: CollectiveTimeoutError (found by rank {w.rank}):\n{text}",
                  file=sys.stderr, flush=True)
            for r in range(w.world):
                if r != w.rank:
                    self.store.set(wake_key(r), _GO)  # their responders read the verdict
            # only ranks whose responder answered can confirm: the others are gone or closing
            alive = sum(1 for st in states.values() if st["state"] != "closing")
            self.stop_rank(text, alive)
        else:
            self.stop_rank(self._wait_verdict())

    def _wait_verdict(self) -> str:
        try:
            self.store.wait([VERDICT_KEY])
            return self.store.get(VERDICT_KEY).decode()
        except Exception:
            return "the ranks are out of step"

    def _say_slow(self, states: dict[int, dict[str, Any]], mine: dict[str, Any]) -> None:
        if int(self.store.add(_SLOW_KEY, 1)) != 1:
            return  # once for the whole job: a job whose calls are all slow says it once
        last = min(states.values(), key=lambda s: s.get("waited", 0.0))
        longest = max(s.get("waited", 0.0) for s in states.values())
        print(f"splitsync: every rank is in call #{mine['call']} {mine['op']} at "
              f"{mine['site']}: slow, not out of step. Rank {last['rank']} arrived last; the "
              f"others have waited up to {longest:.0f}s. Waiting on until the "
              f"{self.watch.timeout.total_seconds():g}s timeout.", file=sys.stderr, flush=True)

    # --- stopping ------------------------------------------------------------------------
    def on_verdict(self, text: str) -> None:
        """Another rank found the job out of step: record where this one is and stop."""
        self.stop_rank(text)

    def stop_rank(self, text: str, expect: int | None = None) -> None:
        """Leave this rank's state for the launcher, then end the process: a rank blocked
        inside a collective cannot be made to return. The store's host (rank 0 outside
        torchrun) stops last, so that the ``expect`` ranks that can still read the verdict
        (default all) read it first."""
        if not self._stopping.acquire(blocking=False):
            return
        w = self.watch
        state = self.report()
        state["verdict"] = text.splitlines()[0] if text else ""
        write_state(self.folder, w.rank, state)
        stop_children()
        if w.rank != 0:
            print(f"splitsync: rank {w.rank} stopped: {_line(state)}.", file=sys.stderr,
                  flush=True)
        try:
            stopped = int(self.store.add(_STOPPED_KEY, 1))
            if w.rank == 0:
                until = time.monotonic() + 3.0
                while stopped < (expect or w.world) and time.monotonic() < until:
                    time.sleep(_POLL_S)
                    stopped = int(self.store.add(_STOPPED_KEY, 0))
        except Exception:  # the store's host is gone already
            pass
        sys.stderr.flush()
        self._exit(OUT_OF_STEP_EXIT_CODE)

    def closing(self, site: str) -> None:
        """The run is closing (its responder stops now): a peer's check still learns where
        this rank went, which is the answer when it left its loop early."""
        w = self.watch
        try:
            self.store.set(_CLOSED_KEY.format(rank=w.rank), json.dumps(
                {"rank": w.rank, "state": "closing", "call": w.calls, "op": "", "site": site}))
        except Exception:  # the store's host is gone: nobody will ask
            pass

    def close(self) -> None:
        self._stop.set()
        if self.responder is not None:
            self.responder.close()
            self.responder = None
