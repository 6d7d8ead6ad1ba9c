"""``run.loader`` over a stream: batches on device, ends agreed between ranks, exact positions.

Ends of data (``at_end``):

* ``"stop"`` (default): every rank stops at the first step where some rank has no batch.
  Nobody hangs in DDP or FSDP and nothing is duplicated; the samples other ranks hold at
  that moment are not trained in this epoch, and rank 0 says how many. The ranks agree with
  one all-reduce of one integer per window of up to ``agree_every`` batches (read ahead),
  not per step: windows grow 1, 2, 4, ... so the first step does not wait.
* ``"uneven"``: each rank yields all of its part, no agreement; wrap the loop in
  ``run.join(model)`` (DDP) so ranks that finish early do not hang the others.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from splitsync.data.stream.readers import StreamReaders
from splitsync.distributed import comm
from splitsync.distributed.device import move_to
from splitsync.distributed.logs import get_logger

if TYPE_CHECKING:
    from splitsync.data.loader import LoaderHooks

__all__ = ["StreamLoader", "AT_END", "SHARD_SHIFT", "sample_id", "batch_ids"]

AT_END = ("stop", "uneven")
SHARD_SHIFT = 40  # a stream sample's id: shard << 40 | position in the shard's epoch order


def sample_id(shard: int, position: int) -> int:
    """One int naming a stream sample: its shard and its position in that shard's epoch
    order (the same for every world size and worker count)."""
    return (shard << SHARD_SHIFT) | position


def batch_ids(counts: list[tuple[int, int, int]]) -> list[int]:
    """The sample ids of a batch from its ``(shard, first position, count)`` runs."""
    ids: list[int] = []
    for s, first, c in counts:
        base = (s << SHARD_SHIFT) + first
        ids.extend(range(base, base + c))
    return ids


class StreamLoader:
    """A loader over a stream, with the surface of the map-style loader."""

    sampler = None  # no index sampler: positions are per shard
    train: bool | None = None  # see DeviceLoader.train
    repeats = 1

    def __init__(self, readers: StreamReaders, loader: DataLoader, device: torch.device, *,
                 at_end: str, hooks: LoaderHooks | None = None,
                 agree_every: int = 64) -> None:
        if at_end not in AT_END:
            raise ValueError(f"at_end={at_end!r}: choose one of {AT_END}.")
        if not isinstance(agree_every, int) or agree_every < 1:
            raise ValueError(f"agree_every={agree_every!r}: give a positive number of batches.")
        self.agree_every = agree_every
        self.readers = readers
        self.loader = loader
        self.device = device
        self.at_end = at_end
        self.hooks = hooks
        self.rank, self.world_size = readers.rank, readers.world
        self.batches_seen = 0
        self.last_batch = False
        self.untrained = 0  # samples held when the ranks stopped at the end of the last pass
        self.epoch = 0
        self.pass_epoch: int | None = None
        self.finished = False  # the pass of ``epoch`` ran to its end on this rank
        # the last pass that ended early: (epoch, samples read on some rank, not trained)
        self.ended_early: tuple[int, int] | None = None
        self._consumed = [0] * readers.source.n_shards  # this rank, since the pass began
        self._resume_epoch: int | None = None
        self._reported = False

    @property
    def dataset(self) -> Any:
        return self.readers.source

    @property
    def batch_size(self) -> int:
        return self.readers.batch_size

    @property
    def length(self) -> int | None:
        """Unknown: a stream's batches per rank are known only once it ends."""
        return None

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; a pending resume position applies only to its own epoch."""
        if self._resume_epoch != epoch:
            self.readers.offsets = [0] * len(self.readers.offsets)
            self.readers.rotation = 0
        self._resume_epoch = None
        self.epoch = self.readers.epoch = epoch
        self.finished = False

    def _report(self) -> None:
        if self._reported or self.rank != 0:
            return
        self._reported = True
        src = self.readers.source
        log = get_logger()
        layout = self.readers.layout
        msg = layout.describe(src.kind, self.world_size, self.readers.workers)
        (log.info if layout.mode == "shard" else log.warning)(msg)
        done = sum(self.readers.offsets)
        if done:
            how = ("through the library's own state (no decoding of whole record batches)"
                   if not src.skips_by_reading else "by reading and dropping them")
            log.info("run.loader: resuming epoch %d after %d consumed sample(s); they are "
                     "skipped %s, never trained", self.epoch, done, how)

    def _all_reduce(self, values: list[int], op: str) -> list[int]:
        # through comm and the run's observers: the hang guard and the straggler clock see it
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        if self.hooks is not None:
            t = self.hooks.collective("all_reduce", comm.reduce, t, op, self.device)
        else:
            t = comm.reduce(t, op, self.device)
        return [int(v) for v in t.tolist()]  # type: ignore[union-attr]

    def __iter__(self) -> Iterator[Any]:
        if self.hooks is not None and self.hooks.arrival is not None:
            self.hooks.arrival()  # a resume's RNG states: before this pass draws anything
        self.batches_seen = 0
        self.last_batch = False
        self.finished = False
        self.untrained = 0
        self.pass_epoch = self.epoch
        self._consumed = [0] * len(self._consumed)
        self._report()
        hooks = self.hooks
        if hooks is not None:  # the active loader, and observers told: no call back up
            hooks.active = self
            for obs in hooks.on_iter:
                obs.on_loader_iter(self)
        it = iter(self.loader)
        cpu = self.device.type == "cpu"
        agree = self.world_size > 1 and self.at_end == "stop"
        stop = self.at_end == "stop"
        window = 1  # grows to agree_every: the first step does not wait for a full window
        ahead: list[Any] = []  # one batch read past the last window, when every rank had it
        while True:
            held = ahead + list(islice(it, window + 1 - len(ahead)))
            # One all-reduce per window: the ranks step through min(held) batches together,
            # exactly what agreeing before every step would give, at 1/window of the cost.
            # One batch more than the window is read, so the last batch is known as it is
            # yielded (``last_batch``: a run's last accumulation window ends there).
            n = self._all_reduce([len(held)], "min")[0] if agree else len(held)
            ends = n <= window
            n = min(n, window)
            ahead = held[n:n + 1] if not ends else []
            for i, (batch, counts) in enumerate(held[:n]):
                for s, _, c in counts:
                    self._consumed[s] += c
                self.batches_seen += 1
                self.last_batch = stop and ends and i == n - 1
                if hooks is not None and (hooks.on_batch or hooks.on_stream_batch):
                    ids = batch_ids(counts)
                    for obs in hooks.on_batch:
                        obs.on_batch(self, ids)
                    for obs in hooks.on_stream_batch:
                        obs.on_stream_batch(self, ids)
                yield batch if cpu else move_to(batch, self.device)
            if ends:
                left = sum(_size(b) for b, _ in held[n:])
                self._end(self._all_reduce([left], "sum")[0] if agree else left)
                return
            window = min(2 * window, self.agree_every)

    def _end(self, held: int) -> None:
        self.finished = True
        self.untrained = held
        if held:
            self.ended_early = (self.epoch, held)
        if held and self.rank == 0:
            get_logger().warning(
                "run.loader: epoch %d ended on the first rank to run out of data; %d sample(s) "
                "already read on other ranks were not trained (at_end='stop' keeps the ranks in "
                "step; pass at_end='uneven' with run.join(model) to train them)%s",
                self.epoch, held, "" if self.readers.layout.mode == "element" else
                ", nor were the rest of those ranks' shards")

    def trim_padding(self, x: torch.Tensor) -> torch.Tensor:
        """Streams are never padded: ``x`` unchanged."""
        return x

    # --- checkpoint positions -------------------------------------------------------------
    def position(self) -> dict[str, Any]:
        """Collective: the epoch and per-shard consumed counts over all ranks, to resume from."""
        n, w = len(self._consumed), self.world_size
        began = self.pass_epoch == self.epoch
        mine = self._consumed if began else [0] * n
        vec = [*mine, *([0] * w), *([0] * w)]
        vec[n + self.rank] = self.batches_seen if began else 0
        vec[n + w + self.rank] = int(self.finished and began)
        if w > 1:
            vec = self._all_reduce(vec, "sum")
        if all(vec[n + w:]) and began:  # every rank finished this epoch: continue at the next
            return {"epoch": self.epoch + 1, "offsets": [0] * n, "batches": [0] * w,
                    "workers": self.readers.workers, "stream": True}
        offsets = [a + b for a, b in zip(self.readers.offsets, vec[:n], strict=True)]
        return {"epoch": self.epoch, "offsets": offsets, "batches": vec[n:n + w],
                "workers": self.readers.workers, "stream": True}

    def rng_state(self) -> torch.Tensor | None:
        """None: a stream's order is fixed by (seed, epoch) and its position alone."""
        return None

    def restore(self, pos: Mapping[str, Any], rng_state: torch.Tensor | None = None) -> None:
        """Continue at ``pos`` (from :meth:`position`, at any world size or worker count)."""
        if "offsets" not in pos:
            raise ValueError("the checkpoint holds an indexed loader's position where this "
                             "run made a stream loader; make loaders in the same order.")
        offsets = [int(o) for o in pos["offsets"]]
        if len(offsets) != len(self.readers.offsets):
            raise ValueError(f"the checkpoint's stream had {len(offsets)} shard(s), this one "
                             f"has {len(self.readers.offsets)}: resume the same stream.")
        self.readers.offsets = offsets
        batches = list(pos.get("batches", []))
        same = len(batches) == self.world_size and pos.get("workers") == self.readers.workers
        # Same ranks and workers: worker w takes over from the worker that was next in the
        # DataLoader's round robin, so the batches come in the interrupted order.
        shard = self.readers.layout.mode == "shard"  # element-level deals relative to the prefix
        self.readers.rotation = batches[self.rank] % self.readers.workers if same and shard else 0
        self.epoch = self.readers.epoch = int(pos["epoch"])
        self._resume_epoch = self.epoch


def _size(batch: Any) -> int:
    """Samples in a collated batch: the first dimension of its first tensor (or its length)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        return _size(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, (list, tuple)):
        return _size(batch[0]) if batch else 0
    return 1
