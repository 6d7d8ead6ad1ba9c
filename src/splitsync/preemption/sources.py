"""Where a stop request comes from: a small :class:`Source` protocol and its kinds.

- :class:`SignalSource`: the signals ``init(preempt_signals=...)`` names. SLURM's own
  warnings arrive this way (``sbatch --signal=USR1@N`` sends SIGUSR1, a time limit or
  ``scancel`` SIGTERM), as do Kubernetes' evictions (SIGTERM).
- :class:`FileSource`: a file a scheduler, or a Kubernetes ``preStop`` hook, touches
  (``init(preempt_file=...)``; docs/checkpoints.md has the preStop recipe).
- :class:`~splitsync.preemption.slurm.SlurmSource`: the signals, inside a SLURM job, where a
  stopped run asks SLURM to requeue it.

:meth:`PreemptionSettings.sources <splitsync.preemption.settings.PreemptionSettings.sources>`
picks them. A new kind (a cloud's metadata endpoint, say) is a class with the four methods
below; the
watching thread (:mod:`splitsync.preemption.watch`) asks every source twice a second and
never changes when one is added.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from splitsync.distributed.logs import get_logger

__all__ = ["Source", "SignalSource", "FileSource", "check_stop_file"]


class Source(Protocol):
    """One origin of a stop request."""

    def start(self, wake: Callable[[], None]) -> None:
        """Begin watching; ``wake()`` (async-signal-safe) makes the thread ask at once."""
        ...

    def fired(self) -> tuple[str, float] | None:
        """What asked to stop (a name without spaces) and when (wall clock), or None."""
        ...

    def close(self) -> None:
        """Stop watching (from the main thread at ``run.close``)."""
        ...

    def after_stop(self, name: str) -> str | None:
        """The run stopped on the request ``name`` (from any rank's source; asked on rank 0
        after ``run.close``, or when the grace ran out): what this source does then (SLURM's
        requeues the job), in words; None: nothing."""
        ...


class SignalSource:
    """Signals, by the names ``RunConfig`` keeps (checked there, by
    :func:`~splitsync.preemption.defaults.parse_signals`): the handler only notes the first
    one and wakes the thread (no locks, no store, no logging in a handler). A forked child
    (a DataLoader worker) ignores them: its parent ends it."""

    def __init__(self, signals: Sequence[str]) -> None:
        self.signals = tuple(signal.Signals[name] for name in signals)
        self._pid = os.getpid()
        self._got: tuple[str, float] | None = None
        self._wake: Callable[[], None] = lambda: None
        self._previous: dict[signal.Signals, Any] = {}
        self._closed = False

    def start(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: other ranks' requests still reach us
                get_logger().warning(
                    "run.resume was called outside the main thread: %s will not stop this "
                    "run at an agreed step (requests from other ranks still do).", sig.name)
                return

    def _on_signal(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid or self._closed:
            return
        if self._got is None:
            self._got = (signal.Signals(signum).name, time.time())
        self._wake()

    def fired(self) -> tuple[str, float] | None:
        return self._got

    def close(self) -> None:
        self._closed = True
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; closed, ours ignores signals
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous = {}

    def after_stop(self, name: str) -> str | None:
        return None


class FileSource:
    """A file whose appearance asks for a stop: it fires once the file exists with a
    modification time no older than the source (a file left by an earlier run, on a
    volume that outlived it, stops nothing; ``touch`` it again to ask)."""

    #: the request's name: what ``splitsync run`` and the logs say stopped the run
    NAME = "STOPFILE"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._since = time.time()

    def start(self, wake: Callable[[], None]) -> None:
        self._since = time.time()

    def fired(self) -> tuple[str, float] | None:
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            return None
        # a second of slack: file systems keep mtimes at coarse resolutions
        return (self.NAME, time.time()) if mtime >= self._since - 1.0 else None

    def close(self) -> None:
        pass

    def after_stop(self, name: str) -> str | None:
        return None


def check_stop_file(value: Any) -> str | None:
    """``init(preempt_file=...)``: a path, or None for none."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)) and str(value).strip():
        return os.fspath(value)
    raise ValueError(f"preempt_file={value!r}: give the path of a file whose appearance asks "
                     "the run to stop (e.g. one a Kubernetes preStop hook touches), or None.")
