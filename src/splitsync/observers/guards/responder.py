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
           "ask_everyone"]

_WAKE = "splitsync/guard/wake/{rank}"
_POSITION = "splitsync/guard/stuck/{rank}"
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


def ask_everyone(store: Any, world: int, me: int) -> None:
    """Wake every other rank's responder so that it posts its position now."""
    for r in range(world):
        if r != me:
            store.set(wake_key(r), _ASK)


class Responder:
    """One rank's answering thread; ``position()`` is read from the main thread's state."""

    def __init__(self, store: Any, rank: int, position: Callable[[str], Any | None]) -> None:
        self._store = store
        self._rank = rank
        self._position = position  # site of the main thread -> Position, or None if idle
        self._main = threading.main_thread().ident
        self._client = store.clone()  # its own connection: a blocked wait holds no other call
        self._thread = threading.Thread(target=self._serve, name="splitsync-guard-responder",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        key = wake_key(self._rank)
        try:
            self._client.wait([key], _WAIT)
            reason = self._client.get(key)
            self._client.delete_key(key)  # a later run on the same store starts clean
            if reason != _ASK:
                return
            frame = sys._current_frames().get(self._main) if self._main is not None else None
            me = self._position(user_site(frame) if frame is not None else "?")
            if me is not None:
                self._client.set(position_key(self._rank), json.dumps(asdict(me)))
        except Exception:  # the store went away with a peer: nobody is left to answer
            return

    def close(self) -> None:
        """Wake the thread with a stop word and wait for it (best effort)."""
        if not self._thread.is_alive():
            return
        try:
            self._store.set(wake_key(self._rank), _STOP)
        except Exception:  # store gone: the daemon thread ends with the process
            return
        self._thread.join(timeout=5.0)


def start_responder(store: Any | None, rank: int,
                    position: Callable[[str], Any | None]) -> Responder | None:
    """A responder on ``store``, or None where the store cannot give it a connection."""
    if store is None:
        return None
    try:
        return Responder(store, rank, position)
    except Exception:  # e.g. a store type without clone(): fall back to posting on failure
        return None
