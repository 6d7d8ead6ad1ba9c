"""The board: where the ranks of a run agree on the step to stop after.

A stop request reaches one rank or all of them (from a :mod:`~splitsync.preemption.sources`
source: a signal, a stop file). The ranks agree on one optimizer step to stop after,
through a :class:`Board` in the job's store: a rank whose source fired writes the *request*
(the first one written wins); every rank that sees it posts the number of optimizer steps
it has completed, once, from its main thread at the first forward after seeing it; once
every rank has posted, the stop step is the largest post plus one (see
``splitsync.run.preempt`` for why that is safe). Nothing is read or written while no
request exists, apart from one small thread per rank checking for it twice a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Request", "Board", "LocalBoard", "StoreBoard", "make_board"]


@dataclass(frozen=True)
class Request:
    """The first stop request of a run: which rank, what asked (a signal's name, or a
    source's name without spaces), when (wall clock)."""

    rank: int
    signal: str
    time: float

    def encode(self) -> str:
        return f"{self.rank} {self.signal} {self.time!r}"

    @staticmethod
    def decode(text: str | bytes) -> Request:
        if isinstance(text, bytes):
            text = text.decode()
        rank, name, when = text.split()
        return Request(int(rank), name, float(when))


class Board(Protocol):
    """Where the ranks of one run agree on a stop step (one per run and rank)."""

    def request(self, req: Request) -> Request:
        """Ask every rank to stop; returns the request that counts (the first one)."""
        ...

    def requested(self) -> Request | None:
        """The request, if any rank has made one (called by the watching thread)."""
        ...

    def post(self, rank: int, steps: int) -> None:
        """This rank's completed optimizer steps, posted once."""
        ...

    def stop_step(self) -> int | None:
        """The agreed stop step once every rank has posted, else None."""
        ...


class LocalBoard(Board):
    """A run of one process: nobody to agree with."""

    def __init__(self) -> None:
        self._request: Request | None = None
        self._posted: int | None = None

    def request(self, req: Request) -> Request:
        if self._request is None:
            self._request = req
        return self._request

    def requested(self) -> Request | None:
        return self._request

    def post(self, rank: int, steps: int) -> None:
        self._posted = steps

    def stop_step(self) -> int | None:
        # one more step than posted, as with many ranks: the stop then has a boundary of
        # its own to take its snapshot at (see splitsync.run.preempt)
        return None if self._posted is None else self._posted + 1


class StoreBoard(Board):
    """The job's store under a prefix of this run's own. The watching thread reads through
    its own connection (``watcher``), so it never waits behind the main thread's calls."""

    def __init__(self, store: Any, world_size: int) -> None:
        self.store = store
        self.world_size = world_size
        self._watcher: Any = None

    @property
    def watcher(self) -> Any:
        if self._watcher is None:
            try:
                self._watcher = self.store.clone()
            except Exception:  # a store without clone(): share the main connection
                self._watcher = self.store
        return self._watcher

    def request(self, req: Request) -> Request:
        first = self.watcher.compare_set("request", "", req.encode())
        return Request.decode(first)

    def requested(self) -> Request | None:
        client = self.watcher
        if not client.check(["request"]):
            return None
        return Request.decode(client.get("request"))

    def post(self, rank: int, steps: int) -> None:
        self.store.set(f"steps/{rank}", str(steps))
        self.store.add("posted", 1)  # after the count: a full tally means every count is in

    def stop_step(self) -> int | None:
        if int(self.store.add("posted", 0)) < self.world_size:
            return None
        counts = self.store.multi_get([f"steps/{r}" for r in range(self.world_size)])
        return max(int(c) for c in counts) + 1


def make_board(rank: int, world_size: int, store: Any | None) -> Board:
    """The board of a new run: local for one process, else under the store with a prefix
    no other run on that store has. Each rank counts the runs it made on the store (one
    ``add`` on a key of its own); every rank makes the same runs in the same order, so the
    n-th run of every rank meets under the same prefix, with no collective."""
    if world_size <= 1 or store is None:
        return LocalBoard()
    import torch.distributed as dist

    serial = int(store.add(f"splitsync/preempt/runs/{rank}", 1))
    return StoreBoard(dist.PrefixStore(f"splitsync/preempt/{serial}/", store), world_size)
