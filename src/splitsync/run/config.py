"""The run's configuration, validated once at init(): a frozen :class:`RunConfig` that
composes one frozen sub-settings dataclass per concern (checkpointing, preemption, fault
tolerance, guards, ledger). Each checks its own values in its ``__post_init__`` and keeps
them parsed; RunConfig checks only its own fields, and reads the others' through."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from splitsync.output.trackers import check_loggers
from splitsync.preemption.settings import PreemptionSettings
from splitsync.strategies import check_name
from splitsync.train.precision import PRECISIONS, check_precision_name

if TYPE_CHECKING:
    from splitsync.ft.options import FTOptions

__all__ = ["RunConfig", "CheckpointSettings", "GuardSettings", "LedgerSettings", "PRECISIONS",
           "DEFAULT_STRAGGLER_THRESHOLD", "accumulate_for"]

# run.log reports the slowest rank when the others wait for it a quarter of every step
DEFAULT_STRAGGLER_THRESHOLD = 0.25


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r}: give True or False.")
    return value


@dataclass(frozen=True)
class CheckpointSettings:
    """``init(save_blocking=)``: run.save's default; False: background saves."""

    save_blocking: bool = True

    def __post_init__(self) -> None:
        _check_bool("save_blocking", self.save_blocking)


@dataclass(frozen=True)
class GuardSettings:
    """``init(guards=, timeout=, debug=, desync_after=, straggler_threshold=)``: what watches
    the ranks."""

    guards: bool = True
    timeout: timedelta = timedelta(minutes=10)  # a number is seconds
    debug: bool = False
    # seconds a rank waits in one collective before it asks where the others are (the hang
    # guard's long-wait check); None: SPLITSYNC_DESYNC_AFTER, else 20
    desync_after: float | None = None
    straggler_threshold: float | None = DEFAULT_STRAGGLER_THRESHOLD  # None: no report

    def __post_init__(self) -> None:
        _check_bool("guards", self.guards)
        _check_bool("debug", self.debug)
        timeout = self.timeout
        if not isinstance(timeout, timedelta):
            try:
                timeout = timedelta(seconds=float(timeout))
            except (TypeError, ValueError):
                raise TypeError(f"timeout={timeout!r}: give seconds (a number) or a "
                                "timedelta.") from None
        if timeout <= timedelta(0):
            raise ValueError(f"timeout={self.timeout!r}: give a time > 0 that a collective "
                             "may take (default 10 minutes).")
        object.__setattr__(self, "timeout", timeout)
        if self.desync_after is not None and (
                isinstance(self.desync_after, bool)
                or not isinstance(self.desync_after, (int, float)) or not self.desync_after > 0):
            raise ValueError(f"desync_after={self.desync_after!r}: give the seconds a rank "
                             "waits in one collective before it checks where the others are "
                             "(a number > 0), or None for the default (20).")
        threshold = self.straggler_threshold
        if threshold is not None and (isinstance(threshold, bool)
                                      or not isinstance(threshold, (int, float))
                                      or not threshold >= 0):
            raise ValueError(f"straggler_threshold={threshold!r}: give a fraction of a step "
                             ">= 0 (0.25: report when the others wait a quarter of each step "
                             "for the slowest rank) or None.")


@dataclass(frozen=True)
class LedgerSettings:
    """``init(ledger=)``: record the samples of every step under run_dir/ledger (that it
    needs a run_dir is RunConfig's check: it joins two settings)."""

    ledger: bool = False

    def __post_init__(self) -> None:
        _check_bool("ledger", self.ledger)


def _check_seed(value: Any) -> int | None:
    if value is not None and (not isinstance(value, int) or value < 0):
        raise ValueError(f"seed={value!r}: give a non-negative integer or None.")
    return value


def _check_accumulate(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"accumulate={value!r}: give the number of micro-batches per "
                         "optimizer step, an integer >= 1.")
    return value


def _same(value: Any) -> Any:
    return value  # parsed by torch (device, backend) or by the strategy (its options)


# RunConfig's own fields -> the one function that checks each (and returns it parsed)
_OWN_CHECKS: dict[str, Callable[[Any], Any]] = {
    "seed": _check_seed,
    "strategy": check_name,  # the one unknown-strategy message
    "precision": check_precision_name,
    "device": _same,
    "backend": _same,
    "accumulate": _check_accumulate,
    "run_dir": _same,
    "deterministic": lambda value: _check_bool("deterministic", value),
    "strategy_options": _same,
    # a list or one name becomes a tuple of valid names; an unknown one lists the valid ones
    "loggers": check_loggers,
}

# the sub-settings RunConfig composes, and the names it reads through from each
_PARTS = ("checkpointing", "preemption", "guarding", "sample_ledger")


@dataclass(frozen=True)
class RunConfig:
    """Everything the user chose at ``splitsync.init``: its own fields, and one sub-settings
    object per concern. Each setting is readable under its init keyword
    (``config.preempt_grace``, ``config.save_blocking``...)."""

    seed: int | None = None
    strategy: str = "auto"
    precision: str = "32"
    device: str | None = None
    backend: str | None = None
    accumulate: int = 1
    run_dir: str | None = None
    deterministic: bool = False
    strategy_options: dict[str, Any] = field(default_factory=dict)
    loggers: tuple[str, ...] | None = None  # None: the default trackers (splitsync.output.trackers)
    checkpointing: CheckpointSettings = field(default_factory=CheckpointSettings)
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    fault_tolerance: FTOptions | None = None  # parsed by splitsync.ft.options.ft_options
    guarding: GuardSettings = field(default_factory=GuardSettings)
    sample_ledger: LedgerSettings = field(default_factory=LedgerSettings)
    # init(mesh=...), parsed by splitsync.distributed.mesh.mesh_shape (against the world size)
    mesh: Any = None

    def __post_init__(self) -> None:
        for name, check in _OWN_CHECKS.items():
            object.__setattr__(self, name, check(getattr(self, name)))
        self._check_ledger_dir()

    def _check_ledger_dir(self) -> None:
        if self.sample_ledger.ledger and self.run_dir is None:
            raise ValueError("init(ledger=True) writes the sample ledger under run_dir; pass "
                             "run_dir=... (the folder splitsync audit reads).")

    def changed(self, **changes: Any) -> RunConfig:
        """This config with some of its own fields changed (a tool imposing the strategy,
        an observer moving run_dir): only the changed values are checked, once."""
        unknown = set(changes) - set(_OWN_CHECKS)
        if unknown:
            raise TypeError(f"RunConfig.changed: {sorted(unknown)} are not RunConfig's own "
                            f"fields; give some of {sorted(_OWN_CHECKS)}.")
        new = copy.copy(self)
        for name, value in changes.items():
            object.__setattr__(new, name, _OWN_CHECKS[name](value))
        if "run_dir" in changes:
            new._check_ledger_dir()
        return new

    def settings(self) -> Iterator[tuple[str, Any]]:
        """Every setting under its init keyword, with its parsed value."""
        for f in fields(self):
            if f.name in _PARTS:
                part = getattr(self, f.name)
                for inner in fields(part):
                    yield inner.name, getattr(part, inner.name)
            else:
                yield f.name, getattr(self, f.name)

    # the sub-settings' values, read through under their init keywords
    @property
    def save_blocking(self) -> bool:
        return self.checkpointing.save_blocking

    @property
    def preempt_signals(self) -> tuple[str, ...]:
        return self.preemption.preempt_signals

    @property
    def preempt_grace(self) -> float:
        return self.preemption.preempt_grace

    @property
    def preempt_file(self) -> str | None:
        return self.preemption.preempt_file

    @property
    def guards(self) -> bool:
        return self.guarding.guards

    @property
    def timeout(self) -> timedelta:
        return self.guarding.timeout

    @property
    def debug(self) -> bool:
        return self.guarding.debug

    @property
    def desync_after(self) -> float | None:
        return self.guarding.desync_after

    @property
    def straggler_threshold(self) -> float | None:
        return self.guarding.straggler_threshold

    @property
    def ledger(self) -> bool:
        return self.sample_ledger.ledger


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
