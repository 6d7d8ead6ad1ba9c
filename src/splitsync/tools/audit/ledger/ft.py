"""The sample ledger of a fault-tolerant run (``init(fault_tolerance="torchft", ledger=True)``).

Replica groups train at once, and a group that dies takes no step back: the steps it
committed with its peers stay in the job. So each batch of the training loader is written
down *when it is handed out* (one ``os.write``: a SIGKILL loses nothing the step can still
commit), as an ``F`` record (the step it is for, its group-batch ``k``, the cursor and the
groups of the quorum) followed by an ``S`` record of this rank's sample ids. A step that is
discarded and redone is written again; which attempt counted is settled by the lineage.

The lineage (``L`` records: the committed steps with the groups that took part, carried in
the live-recovery payload and in durable checkpoints) is written at every ``run.save`` and
at ``run.close``. ``splitsync audit`` takes the longest lineage, checks that it tiles the
group-batches exactly once, and counts, per epoch, the samples of the records it names.

Files: ``run_dir/ledger/ft/group-GGGGG/launch-NNNNN/rank-NNNNN.ledger`` (same format as
the ordinary ledger, :mod:`splitsync.tools.audit.ledger.format`).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from splitsync.distributed import comm
from splitsync.observe import Observer
from splitsync.tools.audit.ledger.format import (
    LEDGER_DIR,
    MAGIC,
    json_record,
    launch_dir,
    rank_file,
    steps_record,
)
from splitsync.tools.audit.ledger.recorder import next_launch

__all__ = ["FTLedger", "FT_DIR", "group_root"]

FT_DIR = "ft"


def group_root(run_dir: str | os.PathLike[str], group: int) -> Path:
    """Where replica group ``group`` writes its launches."""
    return Path(run_dir) / LEDGER_DIR / FT_DIR / f"group-{group:05d}"


class FTLedger(Observer):
    """Records every batch the training loader hands out, and the lineage (module doc)."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int, world_size: int,
                 restart_count: int, seed: int | None, group: int, groups: int) -> None:
        root = group_root(run_dir, group)
        launch = comm.broadcast_object(next_launch(root) if rank == 0 else 0)
        launch_dir(root, launch).mkdir(parents=True, exist_ok=True)
        self.path = rank_file(root, launch, rank)
        self.rank = rank
        self.group = group
        self.launch = launch
        self._session: Any = None
        self._described = False
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        # the launch number is this incarnation's number in the lineage's members
        meta = {"launch": launch, "incarnation": launch, "rank": rank,
                "world_size": world_size, "restart_count": restart_count, "seed": seed,
                "group": group, "groups": groups, "host": socket.gethostname(),
                "pid": os.getpid(), "time": time.time()}
        os.write(self._fd, MAGIC + json_record(b"M", meta))

    def _attach(self, loader: Any) -> None:
        session = getattr(loader, "session", None)
        if session is None or self._session is not None:
            return
        self._session = session
        session.record_members = True  # the lineage then says which group trained what
        session.incarnation = self.launch  # before the first step's vote

    def on_loader_iter(self, loader: Any) -> None:
        self._attach(loader)
        if self._session is not None and not self._described and hasattr(loader, "order"):
            self._described = True
            info = {"kind": "ft", "loader": 0, **loader.order.describe(),
                    "step": self._session.step}
            os.write(self._fd, json_record(b"P", info))

    def on_batch(self, loader: Any, ids: list[int]) -> None:
        session, handed = self._session, getattr(loader, "current", None)
        if session is None or handed is None:
            return
        step = session.step + 1  # the step this batch is for
        head = json_record(b"F", {"step": step, "k": handed.k, "start": session.cursor.cursor,
                                  "participants": session.taking})
        body = steps_record(0, [(step, handed.epoch, len(handed.ids), handed.padded)],
                            handed.ids.to(torch.int64).numpy())
        os.write(self._fd, head + body)  # one write: the process may die at any moment

    def _lineage(self) -> bytes:
        if self._session is None:
            return b""
        return json_record(b"L", {**self._session.cursor.state_dict(),
                                  "step": self._session.step})

    def before_save(self, step: int | None) -> None:
        if self._fd >= 0:
            os.write(self._fd, self._lineage())

    def on_close(self, clean: bool) -> None:
        if self._fd < 0:
            return
        step = 0 if self._session is None else self._session.step
        os.write(self._fd, self._lineage() + json_record(b"C", {"clean": clean, "step": step,
                                                                "passes": []}))
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
