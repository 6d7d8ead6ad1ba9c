"""Environment detection and validation: every bad value gets its own message."""

from __future__ import annotations

import pytest

from splitsync.distributed.env import EnvError, detect_env, first_host

TORCHRUN = {
    "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "x",
    "GROUP_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "2",
}


def test_no_launcher_is_single_process() -> None:
    env = detect_env({})
    assert (env.launcher, env.rank, env.world_size, env.distributed) == ("none", 0, 1, False)


def test_torchrun_values_are_read() -> None:
    env = detect_env(TORCHRUN)
    assert env.launcher == "torchrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (1, 1, 2, 2)
    assert (env.master_port, env.restart_count) == (29511, 2)


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"RANK": "one"}, ["RANK='one'", "not an integer", "splitsync run"]),
        ({"WORLD_SIZE": "2.5"}, ["WORLD_SIZE='2.5'", "not an integer"]),
        ({"RANK": "-1"}, ["RANK='-1'", "negative"]),
        ({"RANK": "2"}, ["RANK=2", "WORLD_SIZE=2", "0 to 1"]),
        ({"WORLD_SIZE": "0", "RANK": "0", "LOCAL_RANK": "0"}, ["WORLD_SIZE=0", "at least 1"]),
        ({"LOCAL_RANK": "2"}, ["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"]),
        ({"LOCAL_WORLD_SIZE": "3"}, ["LOCAL_WORLD_SIZE=3", "WORLD_SIZE=2"]),
        ({"MASTER_PORT": "http"}, ["MASTER_PORT='http'", "free TCP port"]),
        ({"MASTER_PORT": "70000"}, ["MASTER_PORT=70000", "1-65535"]),
    ],
)
def test_bad_values_name_variable_value_and_fix(change: dict[str, str], fragments: list[str]) -> None:
    with pytest.raises(EnvError) as info:
        detect_env({**TORCHRUN, **change})
    for fragment in fragments:
        assert fragment in str(info.value)


def test_missing_world_size_with_rank_is_an_error() -> None:
    with pytest.raises(EnvError, match="WORLD_SIZE is not set"):
        detect_env({"RANK": "0"})


def test_slurm_environment() -> None:
    env = detect_env({
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NNODES": "2",
        "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_JOB_ID": "1234",
        "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    })
    assert (env.launcher, env.rank, env.local_rank, env.world_size) == ("slurm", 5, 1, 8)
    assert (env.local_world_size, env.node_rank, env.master_addr) == (4, 1, "gpu003")
    assert env.master_port == 15000 + 1234


def test_slurm_rank_beyond_tasks() -> None:
    with pytest.raises(EnvError, match="SLURM_PROCID=4 is not below SLURM_NTASKS=4"):
        detect_env({"SLURM_PROCID": "4", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"})


def test_openmpi_and_mpich() -> None:
    ompi = detect_env({
        "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "PMIX_NAMESPACE": "3145728001", "MASTER_ADDR": "node0",
    })
    assert (ompi.launcher, ompi.rank, ompi.local_rank, ompi.node_rank) == ("openmpi", 3, 1, 1)
    mpich = detect_env({"PMI_RANK": "2", "PMI_SIZE": "3", "MASTER_PORT": "29510"})
    assert (mpich.launcher, mpich.rank, mpich.world_size) == ("mpich", 2, 3)
    with pytest.raises(EnvError, match="OMPI_COMM_WORLD_SIZE='x'"):
        detect_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "x"})


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("node1", "node1"), ("gpu[003-005,010]", "gpu003"), ("a[7],b[1-2]", "a7"), ("x1,x2", "x1")],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host
