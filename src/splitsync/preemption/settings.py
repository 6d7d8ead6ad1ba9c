"""``init``'s preemption settings, parsed once: the signals as names, the grace in seconds,
the stop file as a path."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from splitsync.preemption.defaults import (
    DEFAULT_PREEMPT_GRACE,
    DEFAULT_PREEMPT_SIGNALS,
    check_grace,
    parse_signals,
)
from splitsync.preemption.slurm import SlurmSource, in_slurm_job
from splitsync.preemption.sources import FileSource, SignalSource, Source, check_stop_file

__all__ = ["PreemptionSettings"]


@dataclass(frozen=True)
class PreemptionSettings:
    """What stops a run at an agreed step: ``init(preempt_signals=, preempt_grace=,
    preempt_file=)``, each checked here and nowhere else."""

    # signals that stop the run after an agreed step, once run.resume has a directory
    preempt_signals: tuple[str, ...] = DEFAULT_PREEMPT_SIGNALS
    preempt_grace: float = DEFAULT_PREEMPT_GRACE  # seconds from the signal to the stop
    preempt_file: str | None = None  # a file whose appearance stops the run likewise

    def __post_init__(self) -> None:
        # names, checked (numbers become names): () turns the signals off
        object.__setattr__(self, "preempt_signals",
                           tuple(s.name for s in parse_signals(self.preempt_signals)))
        object.__setattr__(self, "preempt_grace", check_grace(self.preempt_grace))
        object.__setattr__(self, "preempt_file", check_stop_file(self.preempt_file))

    @property
    def armed(self) -> bool:
        """Whether anything can stop the run: a signal or a stop file."""
        return bool(self.preempt_signals) or self.preempt_file is not None

    def sources(self, environ: Mapping[str, str] | None = None) -> tuple[Source, ...]:
        """Where this run's stop requests come from: the signals (SLURM's, inside a SLURM
        job, which then requeues it), and the stop file if one is named."""
        environ = os.environ if environ is None else environ
        # inside a SLURM job its source stands, signals or none: it requeues on any stop
        signals: Source = (SlurmSource(self.preempt_signals, environ) if in_slurm_job(environ)
                           else SignalSource(self.preempt_signals))
        if self.preempt_file is None:
            return (signals,)
        return signals, FileSource(self.preempt_file)
