"""SLURM's source of a stop request.

Inside a SLURM job the signals a run stops on are SLURM's: ``sbatch --signal=USR1@N`` warns
N seconds ahead of the time limit with SIGUSR1; ``scancel``, the time limit itself and
SLURM's own preemption send SIGTERM. The job is told apart by its environment
(``SLURM_JOB_ID``, set for every step of a job). :class:`SlurmSource` watches the signals
as :class:`~splitsync.preemption.sources.SignalSource` does; what is its own is the end of a
stopped run: SLURM requeues a job it preempts by itself, and never one warned ahead of its
time limit, so on any stop but SIGTERM (a cancelled job stays cancelled) it asks SLURM to
queue the job again (:mod:`splitsync.preemption.requeue`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from splitsync.preemption.requeue import requeue, requeue_wanted, slurm_job_id
from splitsync.preemption.sources import SignalSource

__all__ = ["SlurmSource", "in_slurm_job"]


def in_slurm_job(environ: Mapping[str, str]) -> bool:
    """Whether this process is a step of a SLURM job."""
    return slurm_job_id(environ) is not None


class SlurmSource:
    """The signals ``init(preempt_signals=...)`` names, as SLURM sends them to a job; on a
    stop it asks SLURM to requeue the job (see the module doc)."""

    #: what the logs call this source
    NAME = "SLURM"

    def __init__(self, signals: Sequence[str], environ: Mapping[str, str]) -> None:
        self.job = slurm_job_id(environ)
        self._environ = environ
        self._signals = SignalSource(signals)

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(sig.name for sig in self._signals.signals)

    def start(self, wake: Callable[[], None]) -> None:
        self._signals.start(wake)

    def fired(self) -> tuple[str, float] | None:
        return self._signals.fired()

    def close(self) -> None:
        self._signals.close()

    def after_stop(self, name: str) -> str | None:
        """The run stopped on ``name`` (any rank's request; asked on rank 0): requeue the
        job unless SLURM itself ended it (SIGTERM). Returns what happened, in words."""
        if not requeue_wanted(name, self._environ):
            return None
        return requeue(self._environ)
