"""Recorded environments of real launchers -> the right rank, local rank, world size, master."""

from __future__ import annotations

import pytest

from splitsync.distributed.env import EnvError, detect_env
from splitsync.launch.cluster import launch_defaults

# srun -N 2 --ntasks-per-node=4 python train.py; task 5 runs on the second node.
SLURM_SRUN = {
    "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_STEP_NODELIST": "gpu[003-004]",
    "SLURM_NODELIST": "gpu[003-004]", "SLURM_NTASKS": "8", "SLURM_NPROCS": "8",
    "SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "gpu004",
    "SLURM_GTIDS": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
}
# srun -n 6 -N 3 (no --ntasks-per-node): only SLURM_TASKS_PER_NODE has the layout.
SLURM_NO_PER_NODE = {
    "SLURM_JOB_ID": "77", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "cn[7,9-10]",
    "SLURM_NTASKS": "6", "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
}
# mpirun -np 4 --npernode 2 -x MASTER_ADDR=node0 -x MASTER_PORT=29501 python train.py
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_UNIVERSE_SIZE": "4", "PMIX_RANK": "3",
    "MASTER_ADDR": "node0", "MASTER_PORT": "29501",
}
# mpiexec (MPICH Hydra) -n 4 -ppn 2 -genv MASTER_ADDR node0 python train.py
MPICH = {
    "PMI_RANK": "2", "PMI_SIZE": "4", "PMI_FD": "6", "MPI_LOCALRANKID": "0",
    "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29502",
}
# Kubeflow PyTorchJob, 1 master + 3 workers, one process per pod; this is worker-0.
KUBERNETES = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
    "MASTER_ADDR": "mnist-master-0", "MASTER_PORT": "23456", "RANK": "1", "WORLD_SIZE": "4",
    "PET_MASTER_ADDR": "mnist-master-0", "PET_MASTER_PORT": "23456", "PET_NNODES": "4",
    "PET_NODE_RANK": "1", "PYTHONUNBUFFERED": "1", "HOSTNAME": "mnist-worker-0",
}
# What torchrun gives worker 3 of 2 nodes x 2 processes (node rank 1).
TORCHRUN = {
    "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "ROLE_RANK": "3", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "node0",
    "MASTER_PORT": "45123", "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3",
}


@pytest.mark.parametrize("environ, expected", [
    (SLURM_SRUN, ("slurm", 5, 1, 8, 4, 1, "gpu003", 15000 + 4242)),
    (SLURM_NO_PER_NODE, ("slurm", 0, 0, 6, 2, 0, "cn7", 15077)),
    (OPENMPI, ("openmpi", 3, 1, 4, 2, 1, "node0", 29501)),
    (MPICH, ("mpich", 2, 0, 4, 2, 1, "node0", 29502)),
    (KUBERNETES, ("kubernetes", 1, 0, 4, 1, 1, "mnist-master-0", 23456)),
    (TORCHRUN, ("torchrun", 3, 1, 4, 2, 1, "node0", 45123)),
], ids=["slurm", "slurm-tasks-per-node", "openmpi", "mpich", "kubernetes", "torchrun"])
def test_recorded_environment(environ: dict[str, str], expected: tuple) -> None:
    e = detect_env(environ)
    got = (e.launcher, e.rank, e.local_rank, e.world_size, e.local_world_size, e.node_rank,
           e.master_addr, e.master_port)
    assert got == expected


def test_torchrun_restart_count_is_read() -> None:
    assert detect_env(TORCHRUN).restart_count == 2


def test_torchrun_inside_kubernetes_pod_wins_over_pod_identity() -> None:
    # `splitsync run` inside a PyTorchJob pod: the workers carry torchrun's variables.
    environ = {**KUBERNETES, **TORCHRUN}
    e = detect_env(environ)
    assert (e.launcher, e.rank, e.local_rank, e.world_size) == ("torchrun", 3, 1, 4)


def test_kubernetes_rank_outside_world_is_named() -> None:
    with pytest.raises(EnvError, match="RANK=4 is not below WORLD_SIZE=4"):
        detect_env({**KUBERNETES, "RANK": "4"})


def test_slurm_allocation_gives_run_defaults() -> None:
    # srun --ntasks-per-node=1 splitsync run -n 4 train.py, on the second of two nodes.
    environ = {"SLURM_JOB_ID": "991", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[01-02]",
               "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
               "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2"}
    c = launch_defaults(environ)
    assert (c.source, c.nnodes, c.node_rank, c.endpoint, c.rdzv_id) == (
        "slurm", "2", 1, "node01:29400", "slurm-991")


def test_slurm_run_defaults_reject_several_agents_per_node() -> None:
    with pytest.raises(EnvError, match="SLURM_LOCALID=1.*ntasks-per-node=1"):
        launch_defaults(SLURM_SRUN)


def test_kubernetes_pod_gives_run_defaults() -> None:
    environ = {**KUBERNETES, "PET_NNODES": "1:4", "PET_NODE_RANK": "2", "PET_RDZV_ID": "mnist",
               "PET_NPROC_PER_NODE": "auto"}
    c = launch_defaults(environ)
    assert (c.source, c.nnodes, c.node_rank, c.endpoint, c.rdzv_id) == (
        "kubernetes", "1:4", 2, "mnist-master-0:23456", "mnist")
    assert c.nproc_per_node == "auto"


def test_plain_machine_has_no_run_defaults() -> None:
    assert launch_defaults({"HOME": "/root", "PATH": "/usr/bin"}).source == "none"
    assert detect_env({"HOME": "/root"}).launcher == "none"
