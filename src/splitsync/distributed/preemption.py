"""What every rank of a preempted job shares: the exit code, the signals, and the board.

A preemption (SLURM's ``scancel`` or time limit, a Kubernetes eviction, a spot reclaim, or
SLURM's ``--signal=USR1@N`` warning) reaches one rank or all of them as a signal. The ranks
agree on one optimizer step to stop after, through a :class:`Board` in the job's store: a
rank that gets a signal writes the *request* (the first one written wins); every rank that
sees it posts the number of optimizer steps it has completed, once, from its main thread
at the first forward after seeing it; once every rank has posted, the stop step is the
largest post plus one (see ``splitsync.run.preempt`` for why that is safe). Nothing is
read or written while no request exists, apart from one small thread per rank checking
for it twice a second.

Also here, because the launcher reads them too: the exit code, and the notes a worker
leaves for ``splitsync run`` (:func:`write_note`, :func:`read_notes`).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "PREEMPTED_EXIT_CODE", "DEFAULT_PREEMPT_SIGNALS", "DEFAULT_PREEMPT_GRACE", "NOTES_VAR",
    "Request", "Board", "LocalBoard", "StoreBoard", "make_board", "parse_signals",
    "check_grace", "write_note", "read_notes", "FAILURE_NOTE", "failure_marked",
]

#: The exit code of a process stopped by a preemption (EX_TEMPFAIL in sysexits.h: "a
#: temporary failure; try again later"). Launching the same command again resumes.
PREEMPTED_EXIT_CODE = 75

#: Signals that stop a run at an agreed step: SIGTERM (scancel, time limits, Kubernetes,
#: torchrun's agent forwarding its own SIGTERM) and SIGUSR1 (SLURM's ``--signal=USR1@N``).
DEFAULT_PREEMPT_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1")

#: Seconds from the signal within which the run must reach its stop step; under SLURM's
#: default KillWait (30 s), with 10 s left for the stop's checkpoint and the exit.
DEFAULT_PREEMPT_GRACE = 20.0

#: Set by ``splitsync run`` for its workers: a folder where a stopped worker leaves a note,
#: so that the launcher exits with PREEMPTED_EXIT_CODE (see :func:`write_note`).
NOTES_VAR = "SPLITSYNC_STOP_NOTES"

_FIX = ("give signal names or numbers, e.g. preempt_signals=('SIGTERM', 'SIGUSR1'), or () to "
        "turn preemption handling off")
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def parse_signals(value: Iterable[str | int] | str | int | None) -> tuple[signal.Signals, ...]:
    """``init(preempt_signals=...)`` as signals: names (``"SIGTERM"``, ``"USR1"``) or
    numbers; None or () for none. Unknown names and uncatchable signals are refused."""
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        value = (value,)
    out: list[signal.Signals] = []
    for item in value:
        try:
            if isinstance(item, bool):
                raise ValueError(item)
            if isinstance(item, int):
                sig = signal.Signals(item)
            else:
                name = str(item).strip().upper()
                sig = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        except (KeyError, ValueError):
            raise ValueError(f"preempt_signals: {item!r} is not a signal; {_FIX}.") from None
        if sig in _UNCATCHABLE:
            raise ValueError(f"preempt_signals: {sig.name} cannot be caught; {_FIX}.")
        if sig not in out:
            out.append(sig)
    return tuple(out)


def check_grace(value: Any) -> float:
    """``init(preempt_grace=...)``: a positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"preempt_grace={value!r}: give the seconds a run has, from the "
                         "signal, to reach its stop step (a number > 0; "
                         f"default {DEFAULT_PREEMPT_GRACE:g}, under SLURM's KillWait of 30 s).")
    return float(value)


@dataclass(frozen=True)
class Request:
    """The first stop request of a run: who got which signal, when (wall clock)."""

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


# --- notes for splitsync run ---------------------------------------------------------------
def write_note(environ: Mapping[str, str], rank: int, record: Mapping[str, Any]) -> bool:
    """Under ``splitsync run``, leave ``record`` for the launcher (atomically); returns
    whether there was a launcher to tell."""
    folder = environ.get(NOTES_VAR)
    if not folder or not os.path.isdir(folder):
        return False
    path = Path(folder) / f"rank-{rank:05d}.json"
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps({**record, "rank": rank, "time": time.time()}))
    os.replace(part, path)
    return True


#: Left in the notes folder by ``splitsync run`` while torchrun's agent stops the workers
#: because one of them failed (to restart them, or for good): the SIGTERM the others then
#: get is not a preemption, and waiting for a stop step a dead rank never reaches would only
#: delay the restart by the grace period.
FAILURE_NOTE = "failure"


def failure_marked(environ: Mapping[str, str]) -> bool:
    """Whether ``splitsync run`` is stopping the workers after a failure (see FAILURE_NOTE)."""
    folder = environ.get(NOTES_VAR)
    return bool(folder) and (Path(folder) / FAILURE_NOTE).exists()


def read_notes(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The notes the workers left, in rank order (unreadable ones are skipped)."""
    notes = []
    for path in sorted(Path(folder).glob("rank-*.json")):
        try:
            notes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return notes
