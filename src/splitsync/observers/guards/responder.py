"""Answer a peer's "where are you?" while this rank is blocked inside a collective.

A rank whose collective fails asks every other rank for its position. A rank that is itself
waiting in another collective cannot answer from its main thread (it is inside the backend),
and it would post only when its own collective times out: on a loaded machine that can be
later than the asking rank is willing to wait. So each rank keeps one small thread blocked on
its own store connection; a request wakes it, it reads where the main thread stands (the
guard's counters and the main thread's frame) and posts that at once. Nothing is sent while
things go well: the thread only waits.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from splitsync.observers.guards.site import user_site

__all__ = ["Responder", "start_responder", "run_key", "run_store", "wake_key", "position_key",
           "report_key", "ask_everyone", "GENERATION_KEY", "VERDICT_KEY"]

_WAKE = "splitsync/guard/wake/{rank}"
_POSITION = "splitsync/guard/stuck/{rank}"
_REPORT = "splitsync/guard/report/{rank}"
GENERATION_KEY = "splitsync/guard/generation"  # one number per long-wait check, increasing
VERDICT_KEY = "splitsync/guard/verdict"  # the first out-of-step verdict: every rank stops
_ASK = b"ask"
_STOP = b"stop"
_WAIT = timedelta(days=1)  # woken by a key, never by this timeout in practice


def run_key(side_group: Any) -> str:
    """A run's name: its side group's, which every rank of the run shares and no other
    group alive in the process has ("" where PyTorch gives groups no name)."""
    return str(getattr(side_group, "group_name", "") or "")


def run_store(store: Any | None, side_group: Any) -> Any | None:
    """The job's store as one run sees it: under the run's own prefix. Runs alive at once
    in one process (one kept open while another is made and closed) each have a responder;
    without the prefix they would wait on the same keys, and the stop word meant for one
    could be taken by the other, leaving the first waiting until its join timed out."""
    name = run_key(side_group)
    if store is None or not name:
        return store
    import torch.distributed as dist

    return dist.PrefixStore(f"splitsync/run/{name}/", store)


def wake_key(rank: int) -> str:
    """The key rank ``rank``'s responder waits for."""
    return _WAKE.format(rank=rank)


def position_key(rank: int) -> str:
    """The key where rank ``rank`` posts its position."""
    return _POSITION.format(rank=rank)


def report_key(rank: int) -> str:
    """The key where rank ``rank`` posts its state for a long-wait check."""
    return _REPORT.format(rank=rank)


def ask_everyone(store: Any, world: int, me: int) -> None:
    """Wake every other rank's responder so that it posts its position now."""
    for r in range(world):
        if r != me:
            store.set(wake_key(r), _ASK)


class Responder:
    """One rank's answering thread; ``position()`` is read from the main thread's state.

    Every wake answers the two kinds of question at once (the wake key holds one value, and
    two askers may overwrite each other): the failing rank's (``position_key``) and the
    long-wait check's (``report_key``, stamped with the check's generation). A verdict of
    the check (``verdict_key``) makes it call ``on_verdict``, which stops this rank.
    """

    def __init__(self, store: Any, rank: int, position: Callable[[str], Any | None],
                 report: Callable[[Any], dict[str, Any]] | None = None,
                 on_verdict: Callable[[str], None] | None = None) -> None:
        self._store = store
        self._rank = rank
        self._position = position  # site of the main thread -> Position, or None if idle
        self._report = report  # main thread's frame -> this rank's state, for the check
        self._on_verdict = on_verdict
        self._main = threading.main_thread().ident
        self._closing = threading.Event()
        self._client = store.clone()  # its own connection: a blocked wait holds no other call
        self._thread = threading.Thread(target=self._serve, name="splitsync-guard-responder",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        key = wake_key(self._rank)
        try:
            while True:
                self._client.wait([key], _WAIT)
                reason = self._client.get(key)
                self._client.delete_key(key)  # a later run on the same store starts clean
                if reason == _STOP or self._closing.is_set():
                    return
                self._answer()
        except Exception:  # the store went away with a peer: nobody is left to answer
            return

    def _answer(self) -> None:
        frame = sys._current_frames().get(self._main) if self._main is not None else None
        me = self._position(user_site(frame) if frame is not None else "?")
        if me is not None:
            self._client.set(position_key(self._rank), json.dumps(asdict(me)))
        if self._report is not None:
            generation = int(self._client.add(GENERATION_KEY, 0))  # read after the wake
            state = dict(self._report(frame), generation=generation)
            self._client.set(report_key(self._rank), json.dumps(state))
        if self._on_verdict is not None and self._client.check([VERDICT_KEY]):
            self._on_verdict(self._client.get(VERDICT_KEY).decode())

    def close(self) -> None:
        """Wake the thread with a stop word and wait for it (best effort)."""
        self._closing.set()
        if not self._thread.is_alive():
            return
        try:
            self._store.set(wake_key(self._rank), _STOP)
        except Exception:  # store gone: the daemon thread ends with the process
            return
        self._thread.join(timeout=5.0)


def start_responder(store: Any | None, rank: int, position: Callable[[str], Any | None],
                    report: Callable[[Any], dict[str, Any]] | None = None,
                    on_verdict: Callable[[str], None] | None = None) -> Responder | None:
    """A responder on ``store``, or None where the store cannot give it a connection."""
    if store is None:
        return None
    try:
        return Responder(store, rank, position, report, on_verdict)
    except Exception:  # e.g. a store type without clone(): fall back to posting on failure
        return None
