"""One replica group's steps under torchft: the quorum before a batch is chosen, the vote
after backward, and what a committed step moves on (the cursor, the lineage).

A step is: :meth:`FTSession.begin` (``start_quorum``: the groups of this step are known, and
a group that is behind has loaded its peer's state by the time it returns), the batch of
group-batch ``cursor + rank in quorum``, forward and backward (the hooks average across the
quorum's groups), then :meth:`FTSession.decide` (``should_commit``, once per quorum: False
when any group's all-reduce failed or too few groups took part). Only a committed step moves
the cursor; a discarded one leaves it, so the next quorum hands out the same group-batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from splitsync.ft.cursor import DataCursor
from splitsync.ft.options import FTOptions

__all__ = ["FTSession", "StepOutcome", "Committed", "AloneAfterRestartError",
           "GroupDivergedError"]


class AloneAfterRestartError(RuntimeError):
    """A restarted group found no other group and nothing to continue from."""


class GroupDivergedError(RuntimeError):
    """The ranks of one replica group hold different steps (a partial live recovery)."""


@dataclass(frozen=True)
class StepOutcome:
    """What ``run.step`` returns under ``fault_tolerance="torchft"``: truthy when the step
    counted. ``committed``: the optimizer stepped (every group of the quorum agreed);
    ``step``: committed steps of the job so far; ``participants``: replica groups whose
    batches the step averaged; ``norm``: the gradient norm before clipping (``clip=``)."""

    committed: bool
    step: int
    participants: int
    norm: torch.Tensor | None = None

    def __bool__(self) -> bool:
        return self.committed

    @property
    def stepped(self) -> bool:
        """``committed``, by :class:`~splitsync.run.result.StepResult`'s name: a loop that
        reads ``run.step(...).stepped`` runs unchanged under fault tolerance."""
        return self.committed


@dataclass(frozen=True)
class Committed:
    """The last committed step: its number, the cursor it began at, its groups."""

    step: int
    start: int
    participants: int
    members: list[list[int]] = field(default_factory=list)


class FTSession:
    """The Manager of this process's replica group and the state of the step under way."""

    def __init__(self, options: FTOptions, *, restart_count: int, world_size: int,
                 agree: Callable[[list[int]], bool] | None = None) -> None:
        self.options = options
        # Whether the group's ranks hold the same values (a collective over the group), for
        # groups of more than one process: torchft keeps a step per rank, and a rank whose
        # live recovery failed stays behind while its group-mates go on.
        self.agree = agree if world_size > 1 else None
        self.restart_count = restart_count
        self.world_size = world_size
        self.cursor = DataCursor()
        self.manager: Any = None
        # This incarnation of the group, in the lineage's members (the ledger sets its launch
        # number, unique across relaunches; floats carry it exactly below 2**24).
        self.incarnation = restart_count + 1
        self.record_members = False  # set by the ledger: one small extra all-reduce a step
        self.open = False  # a quorum was started and its step is not decided yet
        self.handed = False  # the open quorum's batch was handed out
        self.decision: bool | None = None
        self.participants = 0  # groups in this step's quorum
        self.rank_in_quorum: int | None = None
        # The group-batches the run trains in all (run.epochs sets it), this step's share of
        # them (the last step may have more groups than group-batches left), and whether this
        # group is one without a group-batch: its gradient is then weighted 0 (``scale``).
        self.limit: int | None = None
        self.taking = 0
        self.idle = False
        self.last: Committed | None = None
        self.last_committed = True
        self.quorum_seconds = 0.0  # of the last begin(), a recovery included
        self.recovered = False  # the last begin() loaded a peer's state
        self.recover_seconds = 0.0
        self._first = True

    # --- set-up ----------------------------------------------------------------------------
    def attach(self, manager: Any, pending: dict[str, int] | None) -> None:
        """Use ``manager`` (built after the durable checkpoint was loaded); ``pending`` is the
        Manager state that checkpoint held."""
        self.manager = manager
        if pending:
            manager.load_state_dict(pending)

    def on_recovered(self, seconds: float) -> None:
        """Called by the live-recovery load: the state came from a peer."""
        self.recovered = True
        self.recover_seconds = seconds

    @property
    def step(self) -> int:
        """Committed steps of the job (the Manager's step)."""
        return 0 if self.manager is None else int(self.manager.current_step())

    @property
    def writer(self) -> bool:
        """Whether this group writes durable checkpoints: the first group of the last quorum
        (one writer per checkpoint)."""
        return self.rank_in_quorum == 0

    # --- a step --------------------------------------------------------------------------
    def begin(self) -> None:
        """Start this step's quorum, unless one is open (its batch not yet decided)."""
        if self.open:
            if self.handed:
                raise RuntimeError(
                    "under fault_tolerance='torchft' every batch of the training loader is "
                    "followed by run.step(optimizer) before the next one: the step's quorum "
                    "decides whether it counts.")
            return
        if self.manager is None:
            raise RuntimeError(
                "fault_tolerance='torchft': call run.resume(dir, model=..., optimizer=...) "
                "before the first batch of the training loader; it registers what a "
                "recovering group receives from its peers.")
        self.recovered = False
        start = time.perf_counter()
        self.manager.start_quorum()
        self.participants = int(self.manager.num_participants())
        self.rank_in_quorum = self.manager.participating_rank()
        self.quorum_seconds = time.perf_counter() - start
        left = None if self.limit is None else self.limit - self.cursor.cursor
        self.taking = self.participants if left is None else max(0, min(self.participants, left))
        self.idle = self.rank_in_quorum is not None and self.rank_in_quorum >= self.taking
        self.open, self.decision, self.handed = True, None, False
        if self.agree is not None and not self.agree([self.step, self.cursor.cursor]):
            raise GroupDivergedError(
                f"the ranks of replica group {self.options.group} disagree on the step or the "
                "data cursor after this quorum (a rank's live recovery failed while the "
                "others' succeeded): ending the group so that its agent restarts it and it "
                "recovers whole.")
        if self._first:
            self._first = False
            self._refuse_alone()
        if self.rank_in_quorum is None:
            raise RuntimeError("torchft put this replica group outside its quorum; with "
                               "synchronous quorums every member takes part.")

    @property
    def scale(self) -> float:
        """What this group's gradient is multiplied by before the cross-group mean (which
        divides by the quorum's groups): 0 for a group without a group-batch, so the mean is
        over the groups that trained one."""
        if self.idle:
            return 0.0
        return self.participants / self.taking if self.taking < self.participants else 1.0

    def delivered(self) -> None:
        """The loader handed out this quorum's batch."""
        self.handed = True

    def _refuse_alone(self) -> None:
        # A group restarted after the others finished (or while they are gone) would form a
        # quorum alone and train on by itself: from step 0, or from the last durable
        # checkpoint, repeating steps the job already took. Restarted while the job goes on,
        # it finds the others in its first quorum (they ask for one every step).
        if self.restart_count > 0 and self.options.groups > 1 and self.participants == 1:
            raise AloneAfterRestartError(
                f"replica group {self.options.group} was restarted and its first quorum has "
                "no other group: the job has ended (or every group restarted at once). "
                "Refusing to train on alone from step "
                f"{self.step}, which would repeat steps the job already took.")

    def decide(self) -> bool:
        """Whether this step counts (asked once per quorum; later calls repeat the answer)."""
        if self.decision is not None:
            return self.decision
        if not self.open:
            raise RuntimeError(
                "run.step under fault_tolerance='torchft' needs a batch from the training "
                "loader first (the first loader run.loader made): the step's quorum, started "
                "when the batch is chosen, decides whether it counts.")
        members = self._members() if self.record_members else []
        ok = bool(self.manager.should_commit())
        if ok:
            step = self.step
            start = self.cursor.commit(step, self.taking, members)
            self.last = Committed(step, start, self.taking, members)
        self.decision = ok
        self.last_committed = ok
        self.open = False
        return ok

    def _members(self) -> list[list[int]]:
        """The groups whose batches this step averaged, with their incarnations: a vector
        with this group's slot set, summed across the quorum (torchft zeroes it for a group
        outside the quorum). If it fails the step is discarded anyway."""
        from torch.distributed import ReduceOp

        slots = torch.zeros(self.options.groups, dtype=torch.float32)
        if not self.idle:
            slots[self.options.group] = float(self.incarnation)
        self.manager.allreduce(slots, reduce_op=ReduceOp.SUM).wait()
        return [[g, int(v)] for g, v in enumerate(slots.tolist()) if v > 0.5]

    def close(self) -> None:
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None
