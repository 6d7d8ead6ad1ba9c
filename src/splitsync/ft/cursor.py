"""The global data cursor of a fault-tolerant run, and the lineage of its committed steps.

Data are not sharded per replica group (a dead group's shard would wait for it, and a group
that comes back would replay its own). They are one endless stream of *group-batches*: an
epoch's order (the seeded O(1) shuffle of ``data.permute``) cut into ``per_epoch`` pieces of
``group_size * batch_size`` samples. At each step the groups of the quorum take group-batches
``cursor + r`` (``r`` their rank in the quorum); when the step commits the cursor moves on by
the number of groups that took part, and when it is discarded it stays, so the same
group-batches are trained at the next step. The cursor rides in the live-recovery payload
and in durable checkpoints, so a group that recovers continues from its peers' position.

The lineage lists the committed steps as runs of consecutive steps with the same groups:
``[first step, last step, cursor at the first, groups, members]``, ``members`` the groups'
``[group, incarnation]`` in quorum order (empty when not recorded). It is what
``splitsync audit`` checks: the runs tile group-batches 0..cursor-1 exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from splitsync.data.permute import Permutation

__all__ = ["GroupBatches", "DataCursor", "lineage_problems", "Run"]

Run = list[Any]  # [first_step, last_step, first_cursor, participants, members]


@dataclass(frozen=True)
class GroupBatches:
    """Which samples group-batch ``k`` holds, and which of them rank ``r`` of a group reads."""

    n: int  # the dataset's length
    batch_size: int  # per process
    group_size: int  # processes in a replica group
    seed: int
    shuffle: bool
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("run.loader got an empty dataset.")
        if self.drop_last and self.n < self.size:
            raise ValueError(
                f"drop_last=True with {self.n} samples and group-batches of {self.size} "
                f"({self.group_size} processes x batch_size {self.batch_size}) leaves no "
                "batch in an epoch: lower batch_size or set drop_last=False.")

    @property
    def size(self) -> int:
        """Samples in a group-batch (every rank of a group reads ``batch_size`` of them)."""
        return self.batch_size * self.group_size

    @property
    def per_epoch(self) -> int:
        """Group-batches in an epoch: the last one is padded (repeats from the epoch's start,
        as DistributedSampler pads), or dropped with ``drop_last``."""
        return self.n // self.size if self.drop_last else -(-self.n // self.size)

    def epoch_of(self, k: int) -> int:
        return k // self.per_epoch

    def positions(self, k: int, rank: int) -> tuple[int, torch.Tensor, int]:
        """(epoch, epoch positions, padded count) of rank ``rank``'s part of group-batch k."""
        epoch, j = divmod(k, self.per_epoch)
        lo = j * self.size + rank * self.batch_size
        q = torch.arange(lo, lo + self.batch_size, dtype=torch.int64)
        padded = int((q >= self.n).sum())
        if padded:
            q = torch.remainder(q, self.n)
        return epoch, q, padded

    def indices(self, k: int, rank: int) -> tuple[int, torch.Tensor, int]:
        """(epoch, dataset indices, padded count): the padded repeats come last."""
        epoch, q, padded = self.positions(k, rank)
        if self.shuffle:
            q = Permutation(self.n, self.seed, epoch).at(q)
        return epoch, q, padded

    def describe(self) -> dict[str, Any]:
        """What the order depends on (recorded by the ledger, compared by the audit)."""
        return {"n": self.n, "batch_size": self.batch_size, "group_size": self.group_size,
                "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "per_epoch": self.per_epoch}


@dataclass
class DataCursor:
    """Group-batches consumed by committed steps, and the lineage of those steps."""

    cursor: int = 0
    runs: list[Run] = field(default_factory=list)

    def commit(self, step: int, participants: int, members: Sequence[Sequence[int]] = ()
               ) -> int:
        """Step ``step`` committed with ``participants`` groups; returns the cursor it
        started at."""
        start = self.cursor
        pairs = [list(map(int, m)) for m in members]
        last = self.runs[-1] if self.runs else None
        if (last is not None and last[1] + 1 == step and last[3] == participants
                and last[4] == pairs):
            last[1] = step
        else:
            self.runs.append([step, step, start, participants, pairs])
        self.cursor = start + participants
        return start

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "lineage": [list(r) for r in self.runs]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.cursor = int(state["cursor"])
        self.runs = [[int(r[0]), int(r[1]), int(r[2]), int(r[3]), [list(m) for m in r[4]]]
                     for r in state["lineage"]]


def lineage_problems(runs: Sequence[Run], cursor: int) -> list[str]:
    """Why ``runs`` do not tile group-batches 0..cursor-1 exactly once with consecutive
    steps (empty when they do)."""
    problems: list[str] = []
    expect_cursor, expect_step = 0, None
    for first, last, start, parts, members in runs:
        if last < first or parts < 1:
            problems.append(f"steps {first}-{last}: an empty run ({parts} groups)")
        if expect_step is not None and first != expect_step:
            problems.append(f"step {first} follows step {expect_step - 1}: steps "
                            f"{expect_step}-{first - 1} are missing or repeated")
        if start != expect_cursor:
            how = "skipped" if start > expect_cursor else "trained twice"
            lo, hi = sorted((start, expect_cursor))
            problems.append(f"step {first} begins at group-batch {start} where the steps "
                            f"before ended at {expect_cursor}: group-batches {lo}-{hi - 1} "
                            f"{how}")
        if members and len(members) != parts:
            problems.append(f"steps {first}-{last}: {parts} groups counted but "
                            f"{len(members)} took part")
        expect_cursor = start + (last - first + 1) * parts
        expect_step = last + 1
    if expect_cursor != cursor:
        problems.append(f"the steps consumed group-batches up to {expect_cursor} but the "
                        f"cursor is at {cursor}")
    return problems
