"""The watching thread: waits for a stop request, then for the deadline.

It asks this rank's sources, and the board for another rank's request, every
``POLL_SECONDS`` (a source can wake it sooner); nothing else runs per step until a request
exists. The first request seen is handed to ``seen`` (on this thread). ``grace`` seconds
after the request (counted from its time, as the killer counts), if the run has not closed,
``late`` is called: once more ``grace`` if ``stopping()`` says the stop's save is under way,
then ``give_up`` ends the process.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable, Sequence

from splitsync.preemption.board import Board, Request
from splitsync.preemption.sources import Source

__all__ = ["Watcher", "POLL_SECONDS"]

POLL_SECONDS = 0.5  # how often a rank looks for a request


class Watcher:
    """One rank's watching thread over its sources and the run's board."""

    def __init__(self, *, rank: int, board: Board, sources: Sequence[Source], grace: float,
                 seen: Callable[[Request], None], stopping: Callable[[], bool],
                 give_up: Callable[[], None]) -> None:
        self.rank = rank
        self.board = board
        self.sources = tuple(sources)
        self.grace = grace
        self._seen, self._stopping, self._give_up = seen, stopping, give_up
        self.closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        for source in self.sources:
            source.start(self.wake)
        self._thread = threading.Thread(target=self._serve, name="splitsync-preempt",
                                        daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Make the thread look now (safe in a signal handler)."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    def _sleep(self, seconds: float) -> None:
        ready, _, _ = select.select([self._wake_r], [], [], max(0.0, seconds))
        if ready:
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 64)

    def _serve(self) -> None:
        try:
            self._watch()
        except Exception:  # the store went away (its host ended): nobody left to stop with
            return

    def _mine(self) -> Request | None:
        for source in self.sources:
            fired = source.fired()
            if fired is not None:
                return Request(self.rank, *fired)
        return None

    def _watch(self) -> None:
        request = None
        while request is None:
            self._sleep(POLL_SECONDS)
            if self.closed:
                return
            mine = self._mine()
            if mine is not None:
                try:
                    request = self.board.request(mine)
                except Exception:  # the store is gone with its host: decide alone
                    request = mine
            else:
                request = self.board.requested()
        self._seen(request)
        # the deadline counts from the request, as the killer's does (clamped against clocks
        # of other nodes that disagree with ours)
        now = time.time()
        deadline = now + self.grace - min(max(now - request.time, 0.0), self.grace)
        while not self.closed and time.time() < deadline:
            self._sleep(deadline - time.time())
        if self.closed:
            return
        if self._stopping():  # the stop's save is under way: give it the same again
            end = time.time() + self.grace
            while not self.closed and time.time() < end:
                self._sleep(end - time.time())
            if self.closed:
                return
        self._give_up()

    def close(self) -> None:
        """End the thread; give the signals back (from the main thread)."""
        if self.closed:
            return
        self.closed = True
        self.wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * POLL_SECONDS)
        for source in self.sources:
            source.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
