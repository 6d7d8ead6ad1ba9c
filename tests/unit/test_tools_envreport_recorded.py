"""Recorded environments of real launchers -> the right rank, local rank, world size, master."""

from __future__ import annotations

import pytest

from splitsync.distributed.env import EnvError, detect_env
from splitsync.distributed.mpi import MPI_PORTS, derived_port
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
# srun -n 6 -N 3 (no --ntasks-per-node): only the *_TASKS_PER_NODE layouts say how many
# tasks each node runs; SLURM sets no SLURM_NTASKS_PER_NODE then.
SLURM_NO_PER_NODE = {
    "SLURM_JOB_ID": "77", "SLURM_JOBID": "77", "SLURM_NNODES": "3",
    "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "cn[7,9-10]",
    "SLURM_NODELIST": "cn[7,9-10]", "SLURM_STEP_NODELIST": "cn[7,9-10]",
    "SLURM_NTASKS": "6", "SLURM_NPROCS": "6", "SLURM_TASKS_PER_NODE": "2(x3)",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_GTIDS": "0,1",
}
# sbatch -N 2 --ntasks-per-node=4, then `srun -n 5` inside: the job's request stays in
# SLURM_NTASKS_PER_NODE, the step's layout (4 + 1) is in SLURM_STEP_TASKS_PER_NODE. Task 4 is
# alone on the second node.
SLURM_STEP_IN_BATCH = {
    "SLURM_JOB_ID": "4243", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu[003-004]",
    "SLURM_STEP_NODELIST": "gpu[003-004]", "SLURM_NTASKS": "5", "SLURM_NPROCS": "5",
    "SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4,1",
    "SLURM_STEP_TASKS_PER_NODE": "4,1", "SLURM_STEP_NUM_TASKS": "5",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "4",
    "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_GTIDS": "4",
}
# The batch script of `sbatch -n 2` itself (no srun): SLURM_PROCID=0 and the allocation's
# SLURM_NTASKS=2, but no step id. `python train.py` here starts one process.
SLURM_BATCH_SCRIPT = {
    "SLURM_JOB_ID": "2", "SLURM_JOB_NAME": "wrap", "SLURM_JOB_NODELIST": "vm",
    "SLURM_NNODES": "1", "SLURM_NODELIST": "vm", "SLURM_NPROCS": "2", "SLURM_NTASKS": "2",
    "SLURM_TASKS_PER_NODE": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0", "SLURM_GTIDS": "0", "SLURM_CPUS_ON_NODE": "2",
}
# mpirun -np 4 --npernode 2 -x MASTER_ADDR=node0 -x MASTER_PORT=29501 python train.py
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_UNIVERSE_SIZE": "4", "PMIX_RANK": "3",
    "PMIX_NAMESPACE": "1161494529", "OMPI_MCA_ess_base_jobid": "1161494529",
    "OMPI_MCA_orte_num_nodes": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29501",
}
# Open MPI 4.1 `mpirun -n 2 python train.py` on one machine, rank 1: its
# OMPI_COMM_WORLD_NODE_RANK is 1, its rank within the node. No MASTER_* at all.
OPENMPI_ONE_NODE = {
    "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1", "OMPI_UNIVERSE_SIZE": "2", "PMIX_RANK": "1",
    "OMPI_MCA_ess_base_jobid": "1161494529", "OMPI_MCA_orte_num_nodes": "1",
    "OMPI_MCA_orte_hnp_uri": "1161494528.0;tcp://192.0.2.2:46337",
    "PMIX_NAMESPACE": "1161494529", "PMIX_ID": "1161494529.1",
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
    (SLURM_STEP_IN_BATCH, ("slurm", 4, 0, 5, 1, 1, "gpu003", 15000 + 4243)),
    (SLURM_BATCH_SCRIPT, ("none", 0, 0, 1, 1, 0, "127.0.0.1", 29500)),
    (OPENMPI, ("openmpi", 3, 1, 4, 2, 1, "node0", 29501)),
    (OPENMPI_ONE_NODE, ("openmpi", 1, 1, 2, 2, 0, "127.0.0.1",
                        derived_port("openmpi-1161494529"))),
    (MPICH, ("mpich", 2, 0, 4, 2, 1, "node0", 29502)),
    (KUBERNETES, ("kubernetes", 1, 0, 4, 1, 1, "mnist-master-0", 23456)),
    (TORCHRUN, ("torchrun", 3, 1, 4, 2, 1, "node0", 45123)),
], ids=["slurm", "slurm-tasks-per-node", "slurm-step-in-batch", "slurm-batch-script",
        "openmpi", "openmpi-one-node", "mpich", "kubernetes", "torchrun"])
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


def test_mpirun_inside_an_allocation_is_an_mpi_job() -> None:
    # sbatch -N 2 --ntasks-per-node=2 then `mpirun -n 4`: mpirun starts one daemon per node
    # with srun, and rank 3 inherits its daemon's step variables (task 1 of 2).
    daemon = {**SLURM_NO_PER_NODE, "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
              "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    e = detect_env({**daemon, **OPENMPI})
    assert (e.launcher, e.rank, e.world_size, e.local_rank) == ("openmpi", 3, 4, 1)


def test_srun_started_mpi_ranks_stay_a_slurm_job() -> None:
    # srun --mpi=pmi2 -n 6: SLURM's PMI gives the same rank and size as SLURM's variables.
    pmi = {"PMI_RANK": "0", "PMI_SIZE": "6", "PMI_FD": "7", "PMI_JOBID": "77.0"}
    e = detect_env({**SLURM_NO_PER_NODE, **pmi})
    assert (e.launcher, e.rank, e.world_size, e.local_world_size) == ("slurm", 0, 6, 2)


def test_slurm_job_and_step_name_the_job() -> None:
    assert detect_env(SLURM_NO_PER_NODE).job_id == "slurm-77.0"
    assert detect_env(SLURM_NO_PER_NODE).port_derived
    assert not detect_env({**SLURM_NO_PER_NODE, "MASTER_PORT": "23456"}).port_derived


def test_slurm_layout_shorter_than_the_node_index_is_named() -> None:
    with pytest.raises(EnvError, match="SLURM_NODEID=3.*SLURM_STEP_TASKS_PER_NODE"):
        detect_env({**SLURM_NO_PER_NODE, "SLURM_NODEID": "3"})


def test_openmpi_jobs_get_different_ports_from_their_job_ids() -> None:
    ports = {detect_env({**OPENMPI_ONE_NODE, "PMIX_NAMESPACE": str(1161494529 + 65536 * k)})
             .master_port for k in range(20)}
    assert len(ports) > 15 and all(p in MPI_PORTS and p not in (29400, 29500) for p in ports)
    e = detect_env(OPENMPI_ONE_NODE)
    assert (e.job_id, e.port_derived) == ("openmpi-1161494529", True)


def test_openmpi_without_any_job_id_asks_for_master_port() -> None:
    bare = {k: v for k, v in OPENMPI_ONE_NODE.items()
            if not k.startswith(("PMIX_", "OMPI_MCA_"))}
    with pytest.raises(EnvError, match="Set MASTER_PORT"):
        detect_env(bare)
    assert detect_env({**bare, "MASTER_PORT": "23000"}).master_port == 23000


def test_recorded_mpich_without_master_port_asks_for_it() -> None:
    # A recorded environment has no PMI socket of this process to name the job by.
    no_port = {k: v for k, v in MPICH.items() if k not in ("MASTER_PORT", "MASTER_ADDR")}
    with pytest.raises(EnvError, match="MASTER_PORT"):
        detect_env(no_port)
