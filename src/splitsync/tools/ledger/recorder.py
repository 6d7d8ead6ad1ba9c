"""The sample ledger: per optimizer step and rank, which samples ``run.loader`` delivered.

``init(ledger=True)`` attaches a :class:`Ledger`. It hears each batch's sample ids
(``on_batch``), credits them to the optimizer step that follows (``on_step_end`` once the
accumulation window steps). Per batch it only extends a flat list of its loader's ids; per
step it appends four numbers (step, epoch, how many ids, how many padded) to another: no
object kept and nothing encoded per step. The buffered passes and steps are encoded
together (per loader two numpy conversions and one checksum) and appended to
``run_dir/ledger/launch-NNNNN/rank-NNNNN.ledger`` with one ``os.write`` after
``FLUSH_STEPS`` steps or ``FLUSH_IDS`` ids, whichever comes first, before every
``run.save`` (``before_save``) and at ``run.close``. So every step a checkpoint commits is in
the file before the checkpoint is: a killed process loses only records of steps after its
last checkpoint, which the restart rolls back anyway.
``run.resume`` writes the step the launch continues from, which is how ``splitsync audit``
knows which earlier steps were rolled back.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from splitsync.dist import comm
from splitsync.observe import Observer
from splitsync.tools.ledger.format import (
    LEDGER_DIR,
    MAGIC,
    json_record,
    launch_dir,
    rank_file,
    steps_record,
)

__all__ = ["Ledger", "LEDGER_DIR", "FLUSH_STEPS", "FLUSH_IDS", "next_launch"]

# Steps, and sample ids, buffered between writes: a write per step would cost a system call
# and an encoding per step. The ids bound keeps the buffer small with large batches (a held
# id is a Python int, up to tens of bytes until it is encoded into 2 to 8).
FLUSH_STEPS = 1024
FLUSH_IDS = 1 << 16


def next_launch(root: Path) -> int:
    """One more than the highest launch under ``root`` (1 for the first)."""
    nums = [int(p.name.split("-")[1]) for p in root.glob("launch-*")
            if p.name.split("-")[1].isdigit()] if root.is_dir() else []
    return max(nums, default=0) + 1


def describe_loader(loader: Any) -> dict[str, Any]:
    """What a pass of ``loader`` depends on: the audit compares these across launches."""
    readers = getattr(loader, "readers", None)
    if readers is not None:  # a stream
        return {"kind": "stream", "seed": readers.seed, "batch_size": readers.batch_size,
                "shuffle": readers.shuffle, "n_shards": readers.source.n_shards,
                "window": readers.window, "world_size": readers.world,
                "workers": readers.workers, "drop_last": readers.drop_last,
                "epoch": loader.epoch, "offsets": list(readers.offsets)}
    s = loader.sampler
    return {"kind": "map", "seed": s.seed, "batch_size": loader.batch_size,
            "shuffle": s.shuffle, "n": len(loader.dataset), "order": s.order,
            "world_size": s.num_replicas, "drop_last": bool(loader.loader.drop_last),
            "epoch": s.epoch, "start": s.start}


class Ledger(Observer):
    """Records every rank's trained samples per optimizer step (see the module doc)."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int, world_size: int,
                 restart_count: int = 0, seed: int | None = None) -> None:
        root = Path(run_dir) / LEDGER_DIR
        launch = next_launch(root) if rank == 0 else 0
        launch = comm.broadcast_object(launch)  # every rank writes into the same launch
        launch_dir(root, launch).mkdir(parents=True, exist_ok=True)
        self.path = rank_file(root, launch, rank)
        self.launch = launch
        self.rank = rank
        self.step = 0
        self._loaders: dict[int, int] = {}  # id(loader) -> index, in order of first pass
        self._objs: list[Any] = []  # keeps indexed loaders alive, so ids are never reused
        # per loader, the ids not yet encoded: the buffered steps' and then those delivered
        # since the last step (counted in _pending by (loader, epoch), in delivery order)
        self._flat: list[list[int]] = []
        # per loader, the buffered steps' table rows back to back: step, epoch, count, padded
        self._rows: list[list[int]] = []
        self._pending: dict[tuple[int, int], int] = {}
        self._padded: dict[tuple[int, int], int] = {}
        self._held = 0  # ids delivered since the last write (a bound on memory)
        self._unwritten = 0  # steps taken since the last write
        self._passes: list[dict[str, Any]] = []  # P records not yet written
        self._live: dict[int, tuple[tuple[int, int], list[int], Any]] = {}  # per pass
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        meta = {"launch": launch, "rank": rank, "world_size": world_size,
                "restart_count": restart_count, "seed": seed, "host": socket.gethostname(),
                "pid": os.getpid(), "time": time.time()}
        os.write(self._fd, MAGIC + json_record(b"M", meta))

    def _index(self, loader: Any) -> int:
        idx = self._loaders.get(id(loader))
        if idx is None:
            idx = self._loaders[id(loader)] = len(self._objs)
            self._objs.append(loader)
            self._flat.append([])
            self._rows.append([])
        return idx

    # --- hooks -------------------------------------------------------------------------
    def on_loader_iter(self, loader: Any) -> None:
        info = describe_loader(loader)
        info["loader"] = self._index(loader)
        info["step"] = self.step
        self._passes.append(info)  # encoded at the next write, with the steps
        self._live[id(loader)] = self._pass_state(loader)

    def _pass_state(self, loader: Any) -> tuple[tuple[int, int], list[int], Any]:
        """What every batch of ``loader``'s pass shares: (loader, epoch), its id list and
        its sampler (None for a stream). A pass's epoch is fixed when it begins (its order
        is drawn then), so a batch need not look it up again."""
        idx = self._index(loader)
        sampler = loader.sampler
        epoch = loader.epoch if sampler is None else sampler.epoch
        return (idx, epoch), self._flat[idx], sampler

    def on_batch(self, loader: Any, ids: list[int]) -> None:
        state = self._live.get(id(loader))
        if state is None:  # a batch without a pass begun before it: look it up
            state = self._live[id(loader)] = self._pass_state(loader)
        key, flat, sampler = state
        flat.extend(ids)
        n = len(ids)
        pending = self._pending
        pending[key] = pending.get(key, 0) + n
        self._held += n
        if sampler is not None and loader.last_batch and sampler.padding:  # a stream: never
            self._padded[key] = sampler.padding

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        if not stepped:  # an accumulation micro-step, or a step the GradScaler skipped:
            return  # the samples wait for the step that updates the model
        self.step += 1
        pending = self._pending
        if not pending:
            return
        # Only numbers per step: the encoding waits for the next write, done in bulk.
        step, padded, rows = self.step, self._padded, self._rows
        for key, count in pending.items():
            rows[key[0]] += (step, key[1], count, padded.pop(key, 0) if padded else 0)
        pending.clear()
        self._unwritten += 1
        if self._unwritten >= FLUSH_STEPS or self._held >= FLUSH_IDS:
            self._flush()

    def after_resume(self, state: Any) -> None:
        self.step = int(state.step)
        for (loader, _), n in self._pending.items():  # delivered before the resume: not
            del self._flat[loader][len(self._flat[loader]) - n:]  # trained from its state
        self._pending.clear()
        self._padded.clear()
        where = None if state.path is None else str(state.path)
        self._flush(json_record(b"R", {"step": self.step, "epoch": int(state.epoch),
                                        "resumed": bool(state.resumed), "path": where,
                                        "world_size": state.world_size}))

    def before_save(self, step: int | None) -> None:
        self._flush()  # in the page cache before the checkpoint commits: a kill keeps them

    def on_save(self, path: Path, step: int) -> None:
        # and on the disk once it has committed, against a machine's crash
        if self._fd >= 0:
            os.fsync(self._fd)

    def on_close(self, clean: bool) -> None:
        if self._fd < 0:
            return
        passes = []
        for idx, loader in enumerate(self._objs):
            finished = getattr(loader, "finished", None)  # a stream's own flag
            if finished is None:  # map-style: the pass ran to its last batch
                finished, epoch = loader.last_batch, loader.sampler.epoch
            else:
                epoch = loader.epoch
            passes.append({"loader": idx, "epoch": epoch, "finished": bool(finished),
                           "untrained": int(getattr(loader, "untrained", 0))})
        self._flush(json_record(b"C", {"clean": clean, "step": self.step, "passes": passes}))
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1

    def _flush(self, last: bytes = b"") -> None:
        """One write: the buffered passes, then every buffered step (one ``S`` record per
        loader), then ``last``. All the numpy and JSON work of many steps happens here at
        once, since after a stretch of training the first such call in a while is slow
        (cold caches: tens of microseconds) and a call per pass or per step would pay it
        each time. The audit orders passes and steps by the step numbers they carry."""
        records = [json_record(b"P", info) for info in self._passes]
        self._passes.clear()
        for loader, rows in enumerate(self._rows):
            if not rows:
                continue
            table = np.array(rows, dtype=np.uint32).reshape(-1, 4)  # C-level conversions
            rows.clear()
            flat = self._flat[loader]
            total = int(table[:, 2].sum(dtype=np.int64))
            ids = np.array(flat[:total], dtype=np.int64)
            del flat[:total]  # what remains: delivered since the last step
            records.append(steps_record(loader, table, ids))
        self._held = sum(map(len, self._flat))  # those of the step under way stay
        self._unwritten = 0
        records.append(last)
        self._write(b"".join(records))

    def _write(self, data: bytes) -> None:
        if self._fd >= 0 and data:
            os.write(self._fd, data)
