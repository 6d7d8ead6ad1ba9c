"""Where a run's time goes: the clock that ``splitsync goodput`` (and ``splitsync audit``)
read back. Attached by ``init`` on rank 0 of every launch whenever ``run_dir`` is given.

One JSON-lines file per process incarnation, ``run_dir/goodput/<group>-<start ns>-<pid>.jsonl``
(``<group>`` is ``x`` without fault tolerance): when the process started (from the kernel,
so imports and set-up count), when ``run.resume`` returned and at which step, the end of
every optimizer step (its number, whether it counted, and under torchft the seconds its
quorum and a live recovery took), each ``run.save``'s stall (from the call until it returns)
and ``run.close``; a run that never resumes, steps or saves writes nothing. Records are
buffered and appended at most every ``FLUSH_SECONDS``, so a
killed process loses less than that; a step costs a clock read and a list append.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from splitsync.observe import Observer

__all__ = ["GoodputClock", "GOODPUT_DIR", "FLUSH_SECONDS", "process_start_time"]

GOODPUT_DIR = "goodput"
FLUSH_SECONDS = 0.5


def process_start_time() -> float:
    """This process's start as a Unix time (Linux: from /proc; elsewhere: now).

    The boot time is taken as now less ``/proc/uptime`` rather than ``/proc/stat``'s
    ``btime``: btime is whole seconds, and an incarnation's start read a second early would
    overlap the previous one's last records.
    """
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            boot = time.time() - float(f.read().split()[0])
        return min(boot + ticks / os.sysconf("SC_CLK_TCK"), time.time())
    except (OSError, ValueError, IndexError):
        return time.time()


class GoodputClock(Observer):
    """Writes the times of a process's steps, saves and recoveries (see the module doc)."""

    def __init__(self, run_dir: str | os.PathLike[str], *, world_size: int, restart_count: int,
                 group: int | None, fault_tolerant: bool) -> None:
        started = process_start_time()
        name = f"{'x' if group is None else group}-{int(started * 1e9)}-{os.getpid()}.jsonl"
        self.path = Path(run_dir) / GOODPUT_DIR / name
        self.ft = fault_tolerant
        self.step = 0
        self._rows: list[list[float]] = []
        self._lines: list[str] = []
        self._session: Any = None
        self._save_began: float | None = None
        self._fd = -1  # opened at the first resume, step or save: a run that trains nothing
        self._opened = False  # leaves no file
        self._next_flush = 0.0
        self._event("start", started=started, group=group, world_size=world_size,
                    restart_count=restart_count, ft=fault_tolerant, pid=os.getpid())

    def _event(self, kind: str, **fields: Any) -> None:
        self._lines.append(json.dumps({"ev": kind, "t": time.time(), **fields}))

    def on_loader_iter(self, loader: Any) -> None:
        session = getattr(loader, "session", None)
        if session is not None:
            self._session = session

    def after_resume(self, state: Any) -> None:
        self.step = int(state.step)
        self._event("resume", step=self.step, resumed=bool(state.resumed))
        self._flush()

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        session = self._session
        if not stepped and not self.ft:
            return  # an accumulation micro-step: its time belongs to the step it ends in
        now = time.time()
        if session is not None:
            self.step = int(session.step)
            recover = session.recover_seconds if session.recovered else 0.0
            self._rows.append([now, self.step, int(stepped), session.quorum_seconds, recover])
            session.recovered = False
        else:
            self.step += 1
            self._rows.append([now, self.step, 1, 0.0, 0.0])
        if now >= self._next_flush:
            self._flush()

    def before_save(self, step: int | None) -> None:
        self._save_began = time.time()

    def _saved(self) -> None:
        if self._save_began is not None:
            self._event("save", began=self._save_began)
            self._save_began = None
            self._flush()

    def on_save(self, path: Path, step: int) -> None:
        self._saved()  # a background save's commit comes here later: nothing is open then

    def on_save_staged(self, step: int) -> None:
        self._saved()

    def on_close(self, clean: bool) -> None:
        if self._fd < 0:
            return
        self._event("close", clean=clean)
        self._flush()
        os.close(self._fd)
        self._fd = -1

    def _flush(self) -> None:
        if not self._opened:
            self._opened = True
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if self._rows:
            self._lines.append(json.dumps({"ev": "steps", "rows": self._rows}))
            self._rows = []
        if self._lines and self._fd >= 0:
            os.write(self._fd, ("\n".join(self._lines) + "\n").encode())
        self._lines = []
        self._next_flush = time.time() + FLUSH_SECONDS
