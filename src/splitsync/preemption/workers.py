"""DataLoader workers that outlive a preemption signal sent to the whole process group.

torchrun's agent, ``splitsync run``, ``scancel``/``srun`` and ``kill -TERM -PGID`` signal
every process of the group, DataLoader workers included. torch's worker handler exits
quietly only when its parent sent SIGTERM; from anyone else the signal kills the worker,
and the main process then raises "DataLoader worker (pid N) is killed by signal", before
its own stop could save anything. A worker made by ``run.loader`` therefore ignores the
run's preemption signals unless its parent sent them: the parent stops at an agreed step,
saves, and then shuts its workers down as usual. A signal from the parent (torch's
shutdown of a worker slow to leave, multiprocessing's ``terminate()`` at exit) or after
the parent died still ends the worker, as torch's own handler would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ShieldedInit"]


@dataclass(frozen=True)
class ShieldedInit:
    """A DataLoader ``worker_init_fn``: shield the worker from ``signals`` sent to its
    process group, then run ``init`` (picklable, for spawned workers too)."""

    init: Callable[[int], Any] | None
    signals: tuple[int, ...]

    def __call__(self, worker_id: int) -> None:
        if self.signals:
            _shield(self.signals)
        if self.init is not None:
            self.init(worker_id)


def shielded(init: Callable[[int], Any] | None,
             signals: Sequence[signal.Signals | int | str]) -> Callable[[int], Any] | None:
    """``init`` wrapped to shield workers from ``signals`` (signals, numbers or names such
    as RunConfig's "SIGTERM"); ``init`` itself when none."""
    if not signals:
        return init
    if isinstance(init, ShieldedInit):
        init = init.init
    return ShieldedInit(init, tuple(int(signal.Signals[s]) if isinstance(s, str) else int(s)
                                    for s in signals))


def _shield(signals: tuple[int, ...]) -> None:
    """From now on, ``signals`` end this worker only when its parent sends them (its
    shutdown: ``terminate()``) or after the parent is gone; from anyone else they are
    ignored. A thread reads them with their sender (``sigwaitinfo``), as torch's own
    SIGTERM handler does in C; the handler stays for a thread that does not block them."""
    parent = os.getppid()

    def from_parent(pid: int) -> bool:
        return pid == parent or os.getppid() != parent

    def on_signal(signum: int, frame: Any) -> None:
        if os.getppid() != parent:
            os._exit(0)  # the parent is gone: leave, as the worker's watchdog would

    def serve() -> None:
        while True:
            try:
                info = signal.sigwaitinfo(wanted)
            except OSError:
                continue
            if from_parent(info.si_pid):
                os._exit(0)  # the parent ends its workers: leave, as torch's handler does

    wanted = set(signals)
    for sig in signals:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, on_signal)
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)  # threads started from now inherit it
    threading.Thread(target=serve, name="splitsync-worker-signals", daemon=True).start()
