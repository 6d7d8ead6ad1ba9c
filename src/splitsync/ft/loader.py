"""The training loader of a fault-tolerant run: each batch is chosen after its step's quorum.

A pass is one epoch of the global stream (see :mod:`splitsync.ft.cursor`): it begins at the
epoch the cursor is in and ends once the cursor has left it. Before each batch it starts the
step's quorum (a group that is behind receives its peers' state there, cursor included), then
reads this rank's part of group-batch ``cursor + rank in quorum``. The samples of a step that
is discarded are handed out again at the next step, since the cursor did not move.

Batches are read in the training process: which group-batch comes next is known only once
the quorum has formed, so workers could not read ahead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset, default_collate

from splitsync.distributed.device import move_to
from splitsync.ft.cursor import GroupBatches
from splitsync.ft.steps import FTSession

if TYPE_CHECKING:
    from splitsync.data.loader import LoaderHooks

__all__ = ["FTLoader", "Handed"]


@dataclass(frozen=True)
class Handed:
    """The batch handed out last: group-batch ``k`` of ``epoch``, this rank's ``ids``
    (dataset indices, the ``padded`` repeats last). ``k`` is -1 for a batch weighted 0 (a
    group without a group-batch at the run's last step): all of it counts as padding."""

    k: int
    epoch: int
    ids: torch.Tensor
    padded: int


class FTLoader:
    """Batches of a map-style dataset from the global cursor (see the module doc)."""

    sampler = None  # no per-rank sampler: the cursor decides
    kind = "ft"

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: bool, drop_last: bool,
                 collate_fn: Callable[[list[Any]], Any] | None, seed: int, rank: int,
                 world_size: int, device: torch.device, hooks: LoaderHooks,
                 session: FTSession) -> None:
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(
                "under fault_tolerance='torchft' the training loader reads an indexable "
                f"dataset (len() and [i]); got a {type(dataset).__name__}. Streams are not "
                "supported by fault-tolerant runs yet.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: give a positive per-process batch "
                             "size.")
        self.dataset = dataset
        self.batch_size = batch_size
        self.order = GroupBatches(len(dataset), batch_size, world_size, seed, shuffle,  # type: ignore[arg-type]
                                  drop_last)
        self.collate = collate_fn or default_collate
        self.rank = rank
        self.device = device
        self.hooks = hooks
        self.session = session
        self.epoch = 0  # the epoch run.epochs last set (the cursor decides what is read)
        self.pass_epoch = 0  # the epoch the current pass reads
        self.passes = 0
        self.batches_seen = 0
        self.last_batch = False
        self.current: Handed | None = None

    @property
    def length(self) -> int | None:
        return None  # how many steps a pass takes depends on how many groups take part

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_now(self) -> int:
        """The epoch the cursor is in."""
        return self.order.epoch_of(self.session.cursor.cursor)

    def __iter__(self) -> Iterator[Any]:
        session, order = self.session, self.order
        self.pass_epoch = self.epoch_now()
        self.passes += 1
        self.batches_seen = 0
        self.last_batch = False
        end = (self.pass_epoch + 1) * order.per_epoch
        hooks = self.hooks
        hooks.active = self
        for obs in hooks.on_iter:
            obs.on_loader_iter(self)
        while session.cursor.cursor < end:
            session.begin()  # may recover a peer's state and move the cursor
            if session.cursor.cursor >= end:
                return  # the quorum stays open for the next pass's first batch
            assert session.rank_in_quorum is not None
            if session.idle:  # more groups than group-batches left: a batch weighted 0
                epoch, ids, padded = order.indices(session.cursor.cursor, self.rank)
                self.current = Handed(-1, epoch, ids, len(ids))
                listed = ids.tolist()
            else:
                k = session.cursor.cursor + session.rank_in_quorum
                epoch, ids, padded = order.indices(k, self.rank)
                self.current = Handed(k, epoch, ids, padded)
                listed = ids.tolist()
                for obs in hooks.on_batch:  # the ledger writes it down before it is trained
                    obs.on_batch(self, listed)
            batch = self.collate([self.dataset[i] for i in listed])
            session.delivered()
            self.batches_seen += 1
            self.last_batch = session.cursor.cursor + session.taking >= end
            yield batch if self.device.type == "cpu" else move_to(batch, self.device)

    def trim_padding(self, x: torch.Tensor) -> torch.Tensor:
        """The current batch's results without the padded repeats of an epoch's last
        group-batch."""
        cur = self.current
        if cur is None or not cur.padded:
            return x
        return x[: x.shape[0] - cur.padded]

    # --- position: the cursor rides in the checkpoint as an object of its own -------------
    def position(self) -> dict[str, Any]:
        return {"epoch": self.epoch_now(), "consumed": 0, "cursor": self.session.cursor.cursor}

    def rng_state(self) -> torch.Tensor | None:
        return None

    def restore(self, pos: Mapping[str, Any], rng_state: torch.Tensor | None = None) -> None:
        if "cursor" not in pos:
            raise ValueError("the checkpoint holds the position of a loader of a run without "
                             "fault tolerance; a fault-tolerant run continues from its own "
                             "checkpoints (the data cursor is saved with them).")
