"""Who am I: rank, world size and rendezvous address, read from the launcher's environment.

Pure functions over a mapping (``os.environ`` by default) so that every launcher's
environment can be recorded and tested without starting a process group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from splitsync.dist.parsing import EnvError, env_int, first_host, slurm_nodelist

__all__ = ["DistEnv", "EnvError", "detect_env", "slurm_master_addr", "first_host"]

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class DistEnv:
    """The identity of this process inside a (possibly one-process) job."""

    launcher: str  # "none", "torchrun", "env", "slurm", "openmpi", "mpich", "kubernetes"
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    restart_count: int = 0

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def num_nodes(self) -> int:
        """Number of machines, assuming the same number of processes on each."""
        return max(1, self.world_size // max(1, self.local_world_size))


def slurm_master_addr(env: Mapping[str, str]) -> str:
    """MASTER_ADDR if given, else the first host of the job's nodelist."""
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    nodelist = slurm_nodelist(env)
    return first_host(nodelist) if nodelist else DEFAULT_MASTER_ADDR


def _port(env: Mapping[str, str], default: int) -> int:
    port = env_int(env, "MASTER_PORT", "Set MASTER_PORT to a free TCP port (1-65535).", default)
    if not 0 < port < 65536:
        raise EnvError(f"MASTER_PORT={port} is outside 1-65535. Set MASTER_PORT to a free TCP port.")
    return port


def _slurm_port(env: Mapping[str, str]) -> int:
    # Derive a job-specific port so that two jobs on one node do not collide.
    job = env.get("SLURM_JOB_ID", "0")
    default = 15000 + int(job) % 10000 if job.isdigit() else DEFAULT_MASTER_PORT
    return _port(env, default)


def _kubernetes(env: Mapping[str, str], rank: int, world: int) -> DistEnv:
    # A PyTorchJob pod without torchrun: the operator sets RANK/WORLD_SIZE per pod, one
    # process per pod, so the pod index is the node rank and the local rank is 0.
    return DistEnv(
        launcher="kubernetes",
        rank=rank,
        local_rank=0,
        world_size=world,
        local_world_size=1,
        node_rank=rank,
        master_addr=env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
        master_port=_port(env, DEFAULT_MASTER_PORT),
    )


def _read(env: Mapping[str, str]) -> DistEnv:
    fix_torchrun = "Launch with `splitsync run -n N script.py` or torchrun, which set it for you."
    if "RANK" in env or "WORLD_SIZE" in env or "TORCHELASTIC_RUN_ID" in env:
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env else "env"
        world = env_int(env, "WORLD_SIZE", fix_torchrun)
        rank = env_int(env, "RANK", fix_torchrun)
        if launcher == "env" and "LOCAL_RANK" not in env and env.get("KUBERNETES_SERVICE_HOST"):
            return _kubernetes(env, rank, world)
        local_world = env_int(env, "LOCAL_WORLD_SIZE", fix_torchrun, default=world)
        local_rank = env_int(env, "LOCAL_RANK", fix_torchrun, default=rank % max(local_world, 1))
        node_rank = env_int(env, "GROUP_RANK", fix_torchrun, default=rank // max(local_world, 1))
        return DistEnv(
            launcher=launcher,
            rank=rank,
            local_rank=local_rank,
            world_size=world,
            local_world_size=local_world,
            node_rank=node_rank,
            master_addr=env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
            master_port=_port(env, DEFAULT_MASTER_PORT),
            restart_count=env_int(env, "TORCHELASTIC_RESTART_COUNT", fix_torchrun, default=0),
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        fix = "Run inside an sbatch/srun allocation, or unset the SLURM_* variables."
        world = env_int(env, "SLURM_NTASKS", fix)
        local_world = env_int(env, "SLURM_NTASKS_PER_NODE", fix, default=0) or env_int(
            env, "SLURM_STEP_TASKS_PER_NODE_INT", fix, default=0
        )
        if not local_world:
            nodes = env_int(env, "SLURM_NNODES", fix, default=1) or 1
            local_world = max(1, world // nodes)
        return DistEnv(
            launcher="slurm",
            rank=env_int(env, "SLURM_PROCID", fix),
            local_rank=env_int(env, "SLURM_LOCALID", fix, default=0),
            world_size=world,
            local_world_size=local_world,
            node_rank=env_int(env, "SLURM_NODEID", fix, default=0),
            master_addr=slurm_master_addr(env),
            master_port=_slurm_port(env),
        )
    if "OMPI_COMM_WORLD_RANK" in env:
        fix = "Launch with mpirun, or unset the OMPI_COMM_WORLD_* variables."
        world = env_int(env, "OMPI_COMM_WORLD_SIZE", fix)
        local_world = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", fix, default=world)
        rank = env_int(env, "OMPI_COMM_WORLD_RANK", fix)
        return DistEnv(
            launcher="openmpi",
            rank=rank,
            local_rank=env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", fix, default=0),
            world_size=world,
            local_world_size=local_world,
            node_rank=env_int(env, "OMPI_COMM_WORLD_NODE_RANK", fix, default=rank // max(local_world, 1)),
            master_addr=env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
            master_port=_port(env, DEFAULT_MASTER_PORT),
        )
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        fix = "Launch with mpiexec (MPICH/Intel MPI), or unset the PMI_* variables."
        world = env_int(env, "PMI_SIZE", fix)
        local_world = env_int(env, "MPI_LOCALNRANKS", fix, default=world)
        rank = env_int(env, "PMI_RANK", fix)
        return DistEnv(
            launcher="mpich",
            rank=rank,
            local_rank=env_int(env, "MPI_LOCALRANKID", fix, default=rank % max(local_world, 1)),
            world_size=world,
            local_world_size=local_world,
            node_rank=rank // max(local_world, 1),
            master_addr=env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
            master_port=_port(env, DEFAULT_MASTER_PORT),
        )
    return DistEnv(launcher="none")


def _validate(e: DistEnv) -> DistEnv:
    names = {
        "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        "env": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        "kubernetes": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
        "openmpi": (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        "mpich": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    }.get(e.launcher)
    if names is None:
        return e
    rank_n, world_n, local_n, local_world_n = names
    if e.world_size < 1:
        raise EnvError(f"{world_n}={e.world_size}: the world size must be at least 1.")
    if e.rank >= e.world_size:
        raise EnvError(
            f"{rank_n}={e.rank} is not below {world_n}={e.world_size}: ranks run from 0 to "
            f"{e.world_size - 1}. Check the launcher's process count."
        )
    if e.local_world_size < 1 or e.local_world_size > e.world_size:
        raise EnvError(
            f"{local_world_n}={e.local_world_size} must be between 1 and {world_n}={e.world_size}."
        )
    if e.local_rank >= e.local_world_size:
        raise EnvError(
            f"{local_n}={e.local_rank} is not below {local_world_n}={e.local_world_size}."
        )
    return e


def detect_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Read and validate the launcher environment; never touches the network."""
    return _validate(_read(os.environ if environ is None else environ))
