"""The sample ledger: per optimizer step and rank, which samples ``run.loader`` delivered.

``init(ledger=True)`` attaches a :class:`Ledger`. It credits the samples each loader
delivered to the optimizer step that follows (``on_step_end`` once the accumulation window
steps). A map-style loader costs it no call per batch: at a step it reads how far the pass
got (``loader.batches_seen``) and keeps a range of the pass's positions; the sampler's
order for the pass turns ranges into ids when they are written (see
:mod:`splitsync.tools.audit.ledger.passes`). A stream's batches bring their ids
(``on_stream_batch``), kept in a flat list. Per step it appends four numbers (step, epoch,
how many ids, how many padded) to a list: no object kept and nothing encoded per step.
The buffered passes and steps are encoded together (per loader two numpy conversions and
one checksum) and appended to ``run_dir/ledger/launch-NNNNN/rank-NNNNN.ledger`` with one
``os.write`` after ``FLUSH_STEPS`` steps or ``FLUSH_IDS`` ids, whichever comes first,
before every ``run.save`` (``before_save``) and at ``run.close``. So every step a checkpoint
commits is in the file before the checkpoint is: a killed process loses only records of
steps after its last checkpoint, which the restart rolls back anyway.
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
from splitsync.tools.audit.ledger.passes import MapPass, ids_of

__all__ = ["Ledger", "LEDGER_DIR", "FLUSH_STEPS", "FLUSH_IDS", "next_launch", "join_launch"]

# Steps, and sample ids, buffered between writes: a write per step would cost a system call
# and an encoding per step. The ids bound keeps each write's work small with large batches
# (and a stream's buffer: a held id is a Python int until it is encoded into 2 to 8 bytes).
FLUSH_STEPS = 1024
FLUSH_IDS = 1 << 16


def next_launch(root: Path) -> int:
    """One more than the highest launch under ``root`` (1 for the first)."""
    nums = [int(p.name.split("-")[1]) for p in root.glob("launch-*")
            if p.name.split("-")[1].isdigit()] if root.is_dir() else []
    return max(nums, default=0) + 1


def describe_loader(loader: Any) -> dict[str, Any]:
    """What a pass of ``loader`` depends on: the audit compares these across launches."""
    said = {"train": getattr(loader, "train", None), "repeats": getattr(loader, "repeats", 1)}
    readers = getattr(loader, "readers", None)
    if readers is not None:  # a stream
        return {**said, "kind": "stream", "seed": readers.seed, "batch_size": readers.batch_size,
                "shuffle": readers.shuffle, "n_shards": readers.source.n_shards,
                "window": readers.window, "world_size": readers.world,
                "workers": readers.workers, "drop_last": readers.drop_last,
                "epoch": loader.epoch, "offsets": list(readers.offsets),
                "ended_early": list(loader.ended_early or ())}  # the last such pass's
    s = loader.sampler
    return {**said, "kind": "map", "batches": len(loader), "seed": s.seed, "batch_size": loader.batch_size,
            "shuffle": s.shuffle, "n": len(loader.dataset), "order": s.order,
            "world_size": s.num_replicas, "drop_last": bool(loader.loader.drop_last),
            "epoch": s.epoch, "start": s.start}


def join_launch() -> None:
    """A rank that records nothing (one of a TP group's other ranks) still takes part in
    the broadcast of the launch's number that every :class:`Ledger` makes."""
    comm.broadcast_object(0)


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
        # Per loader, the ids not yet written. A stream's are held (its batches' ids, the
        # buffered steps' and then those delivered since the last step); a map-style
        # loader's are ranges of its passes' positions, [order, lo, hi], turned into ids
        # only when written: its batches cost nothing.
        self._flat: list[list[int]] = []
        self._segs: list[list[list[Any]]] = []
        # per loader, the buffered steps' table rows back to back: step, epoch, count, padded
        self._rows: list[list[int]] = []
        # samples delivered but not yet credited to a step, in order: [loader, epoch,
        # count, padded] (a stream's batches, and a map-style pass's last batches when
        # another pass began before the step)
        self._pending: list[list[int]] = []
        self._maps: list[MapPass] = []  # the map-style loaders' current passes
        self._held = 0  # about the ids delivered since the last write (open runs aside)
        self._flush_at = FLUSH_STEPS  # the step after which the next write comes
        self._passes: list[dict[str, Any]] = []  # P records not yet written
        self._streams: dict[int, tuple[int, int]] = {}  # id(stream) -> (loader, epoch)
        self._open = False  # an accumulation window's micro-steps since the last step
        self._calls = 0  # run.step calls so far, micro-steps included
        self._eval: set[int] = set()  # evaluation loaders: said, or found (see module doc)
        self._ended: list[dict[str, int]] = []  # stream epochs that ended early (E notes)
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
            self._segs.append([])
            self._rows.append([])
        return idx

    # --- hooks -------------------------------------------------------------------------
    def on_loader_iter(self, loader: Any) -> None:
        info = describe_loader(loader)
        idx = info["loader"] = self._index(loader)
        info["step"] = self.step
        self._passes.append(info)  # encoded at the next write, with the steps
        if getattr(loader, "train", None) is False:
            self._eval.add(idx)
        if idx in self._eval:  # evaluation: its passes only
            self._streams.pop(id(loader), None)
            self._maps = [p for p in self._maps if p.loader is not loader]
            return
        sampler = loader.sampler
        if sampler is None:  # a stream: its batches' ids come with them (on_stream_batch)
            self._streams[id(loader)] = (idx, loader.epoch)
            return
        old = next((p for p in self._maps if p.loader is loader), None)
        if old is not None and getattr(loader, "train", None) is None and old.calls == self._calls and \
                loader.previous_pass_batches == len(loader):
            # it ran out and begins again with no run.step since it began: evaluation
            self._maps.remove(old)
            self._eval.add(idx)
            return
        if old is not None:  # its last batches, delivered since the last step
            self._maps.remove(old)
            self._held += old.close_run(self._rows[idx])
            upto = old.delivered(loader.previous_pass_batches)
            if loader.passes == old.number + 1 and upto > old.credited:  # (else passes went
                self._add_pending(idx, old.epoch, *self._take(old, upto))  # by unheard)
        self._maps.append(MapPass(loader, idx, sampler.pass_order(), self._calls))

    def _find_evaluation(self) -> None:
        """At a step: a pass that ran out with no run.step during it, while another loader
        has batches this step takes, was an evaluation (its samples are not credited)."""
        # (the step count first: a pass with a step during it is training, the usual case)
        done = [p for p in self._maps if p.calls == self._calls
                and getattr(p.loader, "exhausted", False)
                and getattr(p.loader, "train", None) is None]
        if not done:
            return
        waiting = [p for p in self._maps if p not in done and p.loader.passes == p.number
                   and p.loader.batches_seen * p.size > p.credited]
        if waiting or self._pending:
            for p in done:
                self._maps.remove(p)
                self._eval.add(p.idx)

    def _take(self, p: MapPass, upto: int) -> tuple[int, int]:
        """Positions ``p.credited`` to ``upto`` of ``p`` join the ids to write; returns how
        many, and how many of them are padding repeats."""
        seg = p.seg
        if seg is None:  # the pass's open range (always its loader's last one): extended
            seg = p.seg = [p.order, p.credited, upto]
            self._segs[p.idx].append(seg)
        else:
            seg[2] = upto
        n = upto - p.credited
        padded = p.padded(p.credited, upto)
        p.credited = upto
        self._held += n
        return n, padded

    def _add_pending(self, idx: int, epoch: int, n: int, padded: int) -> None:
        pending = self._pending
        last = pending[-1] if pending else None
        if last is not None and last[0] == idx and last[1] == epoch and not last[3]:
            last[2] += n  # the same loader and epoch: one row, its padding at its end
            last[3] = padded
        else:
            pending.append([idx, epoch, n, padded])

    def on_stream_batch(self, loader: Any, ids: list[int]) -> None:
        key = self._streams.get(id(loader))
        if key is None:  # a batch without a pass begun before it: look it up
            if getattr(loader, "train", None) is False:
                return
            key = self._streams[id(loader)] = (self._index(loader), loader.epoch)
        self._flat[key[0]].extend(ids)
        self._add_pending(key[0], key[1], len(ids), 0)
        self._held += len(ids)
        if self._held >= FLUSH_IDS:
            self._flush_at = 0  # a write at the end of the next step

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        if self._maps:
            self._find_evaluation()
        self._calls += 1
        if not stepped:  # an accumulation micro-step, or a step the GradScaler skipped:
            self._open = True  # a window is open (a save now keeps it: before_save)
            return  # the samples wait for the step that updates the model
        self._open = False
        step = self.step = self.step + 1
        # Only numbers per step: no ids, and the encoding waits for the next write, in bulk.
        pending = self._pending
        for p in self._maps:  # how far each map-style pass got: its batches, counted
            loader = p.loader
            upto = loader.batches_seen * p.size
            if upto <= p.credited or loader.passes != p.number:  # (a pass begun unheard)
                continue
            if upto == p.next and step == p.run_last + 1 and upto <= p.real and not pending:
                p.run_last = step  # as many samples as the steps before: the run grows
                p.credited = upto
                p.next = upto + p.run_n
                continue
            self._credit(p, step, upto)
        if pending:
            rows = self._rows
            for idx, epoch, count, padded in pending:
                rows[idx] += (step, epoch, count, padded)
            pending.clear()
        if step >= self._flush_at:
            self._flush()

    def _credit(self, p: MapPass, step: int, upto: int) -> None:
        """The general case of a step taking ``p``'s positions up to ``upto``."""
        self._held += p.close_run(self._rows[p.idx])
        upto = min(upto, p.total)  # a short last batch
        if upto <= p.credited:
            return
        n, padded = self._take(p, upto)
        if self._pending:  # after what was delivered before it: in order
            self._add_pending(p.idx, p.epoch, n, padded)
        elif not padded:  # a run begins: the steps after it that take as many extend it
            p.open_run(step, n)
            room = FLUSH_IDS - self._held  # n more ids a step: the bound's write in time
            self._flush_at = min(self._flush_at, step + max(0, -(-room // n)))
        else:
            self._rows[p.idx] += (step, p.epoch, n, padded)
        if self._held >= FLUSH_IDS:
            self._flush_at = step

    def after_resume(self, state: Any) -> None:
        for p in self._maps:
            self._held += p.close_run(self._rows[p.idx])
        self.step = int(state.step)
        # what was delivered before the resume was not trained from its state: dropped
        for idx, _, n, _ in self._pending:
            flat = self._flat[idx]
            if flat:
                del flat[len(flat) - n:]
            else:
                self._drop_last_positions(idx, n)
        self._pending.clear()
        for p in self._maps:
            p.credited = p.delivered(p.loader.batches_seen)
            p.seg = None
        where = None if state.path is None else str(state.path)
        self._flush(json_record(b"R", {"step": self.step, "epoch": int(state.epoch),
                                        "resumed": bool(state.resumed), "path": where,
                                        "world_size": state.world_size}))

    def _drop_last_positions(self, idx: int, n: int) -> None:
        segs = self._segs[idx]
        while n > 0 and segs:
            seg = segs[-1]
            k = min(seg[2] - seg[1], n)
            seg[2] -= k
            n -= k
            if seg[2] == seg[1]:
                segs.pop()

    def before_save(self, step: int | None) -> None:
        if self._open:
            self._credit_open_window()
        self._flush()  # in the page cache before the checkpoint commits: a kill keeps them

    def _credit_open_window(self) -> None:
        """Samples delivered since the last step, at a save: an accumulation window is open,
        and the checkpoint keeps its gradients (a resume from it steps them), so they go to
        the step the checkpoint is named after. Left to the next step, they would be lost
        with a kill: the resumed launch never delivers them again."""
        step = self.step
        for p in self._maps:
            loader = p.loader
            upto = loader.batches_seen * p.size
            if upto > p.credited and loader.passes == p.number:
                self._credit(p, step, upto)
        if self._pending:
            rows = self._rows
            for idx, epoch, count, padded in self._pending:
                rows[idx] += (step, epoch, count, padded)
            self._pending.clear()

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
                           "untrained": int(getattr(loader, "untrained", 0)),
                           "evaluation": idx in self._eval})
        self._flush(json_record(b"C", {"clean": clean, "step": self.step, "passes": passes,
                                        "ended_early": self._early()}))
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1

    def _early(self) -> list[dict[str, int]]:
        """Each stream's epochs that ended early (``at_end="stop"``), as seen so far."""
        for idx, loader in enumerate(self._objs):
            end = getattr(loader, "ended_early", None)
            if end is not None and idx not in self._eval:
                note = {"loader": idx, "epoch": end[0], "untrained": end[1]}
                if note not in self._ended:
                    self._ended.append(note)
        return self._ended

    def _flush(self, last: bytes = b"") -> None:
        """One write: the buffered passes, then every buffered step (one ``S`` record per
        loader), then ``last``. All the numpy and JSON work of many steps happens here at
        once, since after a stretch of training the first such call in a while is slow
        (cold caches: tens of microseconds) and a call per pass or per step would pay it
        each time. The audit orders passes and steps by the step numbers they carry."""
        for p in self._maps:
            p.close_run(self._rows[p.idx])  # (what they held is counted afresh below)
        records = [json_record(b"P", info) for info in self._passes]
        self._passes.clear()
        for loader, rows in enumerate(self._rows):
            if not rows:
                continue
            table = np.array(rows, dtype=np.uint32).reshape(-1, 4)  # C-level conversions
            rows.clear()
            total = int(table[:, 2].sum(dtype=np.int64))
            flat = self._flat[loader]
            if self._objs[loader].sampler is None:  # a stream: its ids, held
                ids = np.array(flat[:total], dtype=np.int64)
                del flat[:total]  # what remains: delivered since the last step
            else:
                ids = ids_of(self._segs[loader], total)
            records.append(steps_record(loader, table, ids))
        for p in self._maps:
            p.seg = None  # their ranges were written or cut: the next credit opens one
        # what remains: delivered since the last step
        self._held = sum(map(len, self._flat)) + sum(
            seg[2] - seg[1] for segs in self._segs for seg in segs)
        self._flush_at = self.step + FLUSH_STEPS
        records.append(last)
        self._write(b"".join(records))

    def _write(self, data: bytes) -> None:
        if self._fd >= 0 and data:
            os.write(self._fd, data)
