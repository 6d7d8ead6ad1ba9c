"""Threads for srun and mpirun ranks, which get no OMP_NUM_THREADS from their launcher."""

from __future__ import annotations

import pytest

from splitsync.distributed.env import DistEnv, EnvError, batch_note, detect_env
from splitsync.distributed.threads import launcher_threads


def _env(launcher: str, local_world: int) -> DistEnv:
    return DistEnv(launcher=launcher, world_size=2 * local_world, local_world_size=local_world)


@pytest.mark.parametrize(("launcher", "local", "allowed", "online", "threads"), [
    ("slurm", 2, 2, 2, 1),      # srun -n 2 --cpu-bind=none on 2 cores: 1 each, not 2
    ("slurm", 2, 1, 2, 1),      # srun's task/affinity bound each task to 1 core
    ("openmpi", 3, 8, 8, 2),    # shared mask: 8 cores / 3 ranks
    ("mpich", 2, 4, 16, 4),     # bound to 4 cores of 16: the binding already divided them
    ("openmpi", 4, 2, 2, 1),    # oversubscribed: never 0
])
def test_unmanaged_ranks_share_the_node(launcher: str, local: int, allowed: int, online: int,
                                        threads: int) -> None:
    got = launcher_threads(_env(launcher, local), {}, allowed, online)
    assert got is not None and got.count == threads
    assert f"OMP_NUM_THREADS={threads}" in got.note and "yourself" in got.note


def test_cpus_per_task_wins_under_slurm() -> None:
    got = launcher_threads(_env("slurm", 2), {"SLURM_CPUS_PER_TASK": "3"}, 8, 8)
    assert got is not None and got.count == 3 and "SLURM_CPUS_PER_TASK" in got.note
    with pytest.raises(EnvError, match="SLURM_CPUS_PER_TASK='x'"):
        launcher_threads(_env("slurm", 2), {"SLURM_CPUS_PER_TASK": "x"}, 8, 8)


@pytest.mark.parametrize("launcher", ["none", "torchrun", "env", "kubernetes"])
def test_other_launchers_are_left_alone(launcher: str) -> None:
    assert launcher_threads(_env(launcher, 2), {}, 2, 2) is None


def test_the_users_choice_is_kept() -> None:
    assert launcher_threads(_env("slurm", 2), {"OMP_NUM_THREADS": "4"}, 2, 2) is None
    assert launcher_threads(_env("mpich", 2), {"OMP_NUM_THREADS": " "}, 2, 2) is not None


def test_batch_script_without_srun_is_named() -> None:
    batch = {"SLURM_JOB_ID": "2", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    note = batch_note(batch, detect_env(batch))
    assert note is not None and "not 4" in note and "srun" in note
    step = {**batch, "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1"}
    assert batch_note(step, detect_env(step)) is None
    assert batch_note({**batch, "SLURM_NTASKS": "1"}, detect_env(batch)) is None
