"""CPU threads for ranks that srun or mpirun started.

``splitsync run`` (and torchrun) set ``OMP_NUM_THREADS`` for their workers; srun and mpirun
do not. Each rank's torch then runs one thread per CPU it may use, and N ranks sharing a
node's cores run N times too many threads. ``init()`` gives such ranks the share
``splitsync run`` would.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from splitsync.distributed.env import DistEnv
from splitsync.distributed.parsing import optional_int

__all__ = ["Threads", "launcher_threads", "cpu_counts"]

# Launchers that start ranks without choosing their threads (torchrun sets 1 itself).
UNMANAGED = ("slurm", "openmpi", "mpich")


@dataclass(frozen=True)
class Threads:
    """The thread count chosen for this rank, and why (said once, by rank 0)."""

    count: int
    note: str


def launcher_threads(env: DistEnv, environ: Mapping[str, str], allowed: int,
                     online: int) -> Threads | None:
    """Threads for one rank of srun or mpirun; None when OMP_NUM_THREADS is set already.

    ``allowed``: the CPUs this process may run on (its affinity); ``online``: the machine's.
    SLURM's ``--cpus-per-task`` wins. Otherwise the node's CPUs are shared among its ranks,
    and never more than this rank may use: a launcher that binds each rank to its own cores
    (srun's task/affinity, Open MPI's --bind-to core) has already divided them.
    """
    if env.launcher not in UNMANAGED or environ.get("OMP_NUM_THREADS", "").strip():
        return None
    keep = "set OMP_NUM_THREADS yourself to change it."
    if env.launcher == "slurm":
        per_task = optional_int(environ, "SLURM_CPUS_PER_TASK",
                                "Give srun --cpus-per-task a whole number.")
        if per_task:
            return Threads(per_task, f"OMP_NUM_THREADS={per_task} (SLURM_CPUS_PER_TASK); {keep}")
    count = max(1, min(allowed, online // max(1, env.local_world_size)))
    return Threads(count, f"OMP_NUM_THREADS={count} ({online} CPU core(s) / "
                          f"{env.local_world_size} process(es) per node, {allowed} allowed to "
                          f"this one); {keep}")


def cpu_counts() -> tuple[int, int]:
    """(CPUs this process may run on, CPUs online): ``nproc`` would obey OMP_NUM_THREADS."""
    online = os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        allowed = online
    return allowed, online
