"""The run's configuration: one frozen dataclass, validated once at init()."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from splitsync.output.trackers import check_loggers
from splitsync.preemption.defaults import (
    DEFAULT_PREEMPT_GRACE,
    DEFAULT_PREEMPT_SIGNALS,
    check_grace,
    parse_signals,
)
from splitsync.preemption.sources import check_stop_file
from splitsync.strategies import check_name
from splitsync.train.precision import PRECISIONS, check_precision_name

if TYPE_CHECKING:
    from splitsync.ft.options import FTOptions

__all__ = ["RunConfig", "PRECISIONS", "DEFAULT_STRAGGLER_THRESHOLD", "accumulate_for"]

# run.log reports the slowest rank when the others wait for it a quarter of every step
DEFAULT_STRAGGLER_THRESHOLD = 0.25


@dataclass(frozen=True)
class RunConfig:
    """Everything the user chose at ``splitsync.init``."""

    seed: int | None = None
    strategy: str = "auto"
    precision: str = "32"
    device: str | None = None
    backend: str | None = None
    accumulate: int = 1
    timeout: timedelta = timedelta(minutes=10)
    debug: bool = False
    guards: bool = True
    run_dir: str | None = None
    deterministic: bool = False
    save_blocking: bool = True  # run.save's default; False: background saves
    strategy_options: dict[str, Any] = field(default_factory=dict)
    loggers: tuple[str, ...] | None = None  # None: the default trackers (see splitsync.output.trackers)
    straggler_threshold: float | None = DEFAULT_STRAGGLER_THRESHOLD  # None: no report
    fault_tolerance: FTOptions | None = None  # parsed by splitsync.ft.options.ft_options
    # init(mesh=...) checked against the world size (splitsync.distributed.mesh.MeshShape)
    mesh: Any = None
    # signals that stop the run after an agreed step, once run.resume has a directory
    preempt_signals: tuple[str, ...] = DEFAULT_PREEMPT_SIGNALS
    preempt_grace: float = DEFAULT_PREEMPT_GRACE  # seconds from the signal to the stop
    preempt_file: str | None = None  # a file whose appearance stops the run likewise
    ledger: bool = False  # record the samples of every step under run_dir/ledger

    def __post_init__(self) -> None:
        for name in ("debug", "guards", "deterministic", "save_blocking", "ledger"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r}: give True or False.")
        check_name(self.strategy)  # the one unknown-strategy message
        check_precision_name(self.precision)
        if not isinstance(self.accumulate, int) or self.accumulate < 1:
            raise ValueError(
                f"accumulate={self.accumulate!r}: give the number of micro-batches per "
                "optimizer step, an integer >= 1."
            )
        # a list or one name becomes a tuple of valid names; an unknown one lists the valid ones
        object.__setattr__(self, "loggers", check_loggers(self.loggers))
        if self.straggler_threshold is not None and (
                isinstance(self.straggler_threshold, bool)
                or not isinstance(self.straggler_threshold, (int, float))
                or not self.straggler_threshold >= 0):
            raise ValueError(f"straggler_threshold={self.straggler_threshold!r}: give a "
                             "fraction of a step >= 0 (0.25: report when the others wait a "
                             "quarter of each step for the slowest rank) or None.")
        # names, checked (numbers become names): () turns preemption handling off
        object.__setattr__(self, "preempt_signals",
                           tuple(s.name for s in parse_signals(self.preempt_signals)))
        object.__setattr__(self, "preempt_grace", check_grace(self.preempt_grace))
        object.__setattr__(self, "preempt_file", check_stop_file(self.preempt_file))
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed={self.seed!r}: give a non-negative integer or None.")
        if self.ledger and self.run_dir is None:
            raise ValueError("init(ledger=True) writes the sample ledger under run_dir; pass "
                             "run_dir=... (the folder splitsync audit reads).")


def accumulate_for(accumulate: int | Callable[[int], int], world_size: int) -> int:
    """``init(accumulate=...)``: the number itself, or what a function of the world size
    returns for this one (checked: a positive integer)."""
    if not callable(accumulate):
        return accumulate  # RunConfig checks it, with the other arguments
    value = accumulate(world_size)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"init(accumulate=...) returned {value!r} at world size {world_size}: return the "
            "micro-batches per optimizer step on each process, an integer >= 1 (e.g. "
            "lambda world_size: max(1, 40 // world_size)).")
    return value
