"""Put a preempted SLURM job back in the queue (``scontrol requeue``), when it allows it.

SLURM requeues a job it preempts by itself, and never one that hits its time limit, even
with ``--requeue``: the job is told ahead with ``--signal=USR1@N`` and must requeue itself.
So a run that stops on a signal other than SIGTERM requeues its job when the job is
requeueable (``sbatch --requeue``, or ``JobRequeue=1`` in slurm.conf: ``scontrol show job``
says ``Requeue=1``). On SIGTERM (``scancel``, a time limit, SLURM's own preemption) it does
not: a cancelled job stays cancelled.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping

__all__ = ["slurm_job_id", "requeue_wanted", "requeue"]

_TIMEOUT = 10.0  # seconds per scontrol call: the controller answers in milliseconds


def slurm_job_id(environ: Mapping[str, str]) -> str | None:
    """The id ``scontrol`` takes for this job (``<array job>_<task>`` in a job array)."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID") or None


def requeue_wanted(signal_name: str, environ: Mapping[str, str]) -> bool:
    """Whether a stop on ``signal_name`` should requeue: inside a SLURM job, not SIGTERM."""
    return slurm_job_id(environ) is not None and signal_name != "SIGTERM"


def requeue(environ: Mapping[str, str]) -> str:
    """Requeue this SLURM job if it is requeueable; returns what happened, in words."""
    job = slurm_job_id(environ)
    if job is None:
        return "not a SLURM job"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return f"SLURM job {job} not requeued: scontrol is not on PATH"
    try:
        shown = subprocess.run([scontrol, "show", "job", "-o", job], capture_output=True,
                               text=True, timeout=_TIMEOUT)
        if "Requeue=1" not in shown.stdout.split():
            return (f"SLURM job {job} not requeued: it is not requeueable (submit it with "
                    "sbatch --requeue)")
        done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True,
                              timeout=_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"SLURM job {job} not requeued: {exc}"
    if done.returncode != 0:
        return f"SLURM job {job} not requeued: {(done.stderr or done.stdout).strip()}"
    return f"SLURM job {job} requeued"
