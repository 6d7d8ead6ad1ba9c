"""Who am I: rank, world size and rendezvous address, read from the launcher's environment.

Pure functions over a mapping (``os.environ`` by default) so that every launcher's
environment can be recorded and tested without starting a process group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from splitsync.distributed.parsing import EnvError, env_int, first_host, slurm_nodelist

__all__ = ["DistEnv", "EnvError", "detect_env", "slurm_master_addr", "first_host",
           "LauncherVars", "LAUNCHER_VARS", "TORCHRUN", "launched_env"]

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class LauncherVars:
    """The names of the variables in which one launcher says who a process is."""

    rank: str
    world_size: str
    local_rank: str
    local_world_size: str
    node_rank: str = ""  # "": the launcher gives none

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.rank, self.world_size, self.local_rank,
                                 self.local_world_size, self.node_rank) if n)


# Each launcher's variable names: the one place they are written (read, validated, set).
TORCHRUN = LauncherVars("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
LAUNCHER_VARS: Mapping[str, LauncherVars] = {
    "torchrun": TORCHRUN,
    "env": TORCHRUN,
    "kubernetes": TORCHRUN,
    "slurm": LauncherVars("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                          "SLURM_NTASKS_PER_NODE", "SLURM_NODEID"),
    "openmpi": LauncherVars("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                            "OMPI_COMM_WORLD_NODE_RANK"),
    "mpich": LauncherVars("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
}


def launched_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The variables torchrun would give rank ``rank`` of ``world`` on this machine, with a
    loopback rendezvous on ``port`` (what splitsync.launch and testing.spawn set)."""
    v = TORCHRUN
    return {v.rank: str(rank), v.world_size: str(world), v.local_rank: str(rank),
            v.local_world_size: str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


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
    t = TORCHRUN
    if t.rank in env or t.world_size in env or "TORCHELASTIC_RUN_ID" in env:
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env or t.node_rank in env else "env"
        world = env_int(env, t.world_size, fix_torchrun)
        rank = env_int(env, t.rank, fix_torchrun)
        if launcher == "env" and t.local_rank not in env and env.get("KUBERNETES_SERVICE_HOST"):
            return _kubernetes(env, rank, world)
        local_world = env_int(env, t.local_world_size, fix_torchrun, default=world)
        local_rank = env_int(env, t.local_rank, fix_torchrun, default=rank % max(local_world, 1))
        node_rank = env_int(env, t.node_rank, fix_torchrun, default=rank // max(local_world, 1))
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
    v = LAUNCHER_VARS["slurm"]
    if v.rank in env and v.world_size in env:
        fix = "Run inside an sbatch/srun allocation, or unset the SLURM_* variables."
        world = env_int(env, v.world_size, fix)
        local_world = env_int(env, v.local_world_size, fix, default=0) or env_int(
            env, "SLURM_STEP_TASKS_PER_NODE_INT", fix, default=0
        )
        if not local_world:
            nodes = env_int(env, "SLURM_NNODES", fix, default=1) or 1
            local_world = max(1, world // nodes)
        return DistEnv(
            launcher="slurm",
            rank=env_int(env, v.rank, fix),
            local_rank=env_int(env, v.local_rank, fix, default=0),
            world_size=world,
            local_world_size=local_world,
            node_rank=env_int(env, v.node_rank, fix, default=0),
            master_addr=slurm_master_addr(env),
            master_port=_slurm_port(env),
        )
    if LAUNCHER_VARS["openmpi"].rank in env:
        return _mpi(env, "openmpi", "Launch with mpirun, or unset the OMPI_COMM_WORLD_* "
                    "variables.")
    v = LAUNCHER_VARS["mpich"]
    if v.rank in env and v.world_size in env:
        return _mpi(env, "mpich", "Launch with mpiexec (MPICH/Intel MPI), or unset the PMI_* "
                    "variables.")
    return DistEnv(launcher="none")


def _mpi(env: Mapping[str, str], launcher: str, fix: str) -> DistEnv:
    """Open MPI's or MPICH's variables. A missing local rank or node rank is derived from
    the rank and the processes per node (MPICH sets neither; Open MPI the local rank)."""
    v = LAUNCHER_VARS[launcher]
    world = env_int(env, v.world_size, fix)
    local_world = env_int(env, v.local_world_size, fix, default=world)
    rank = env_int(env, v.rank, fix)
    per_node = max(local_world, 1)
    local_default = 0 if launcher == "openmpi" else rank % per_node
    return DistEnv(
        launcher=launcher,
        rank=rank,
        local_rank=env_int(env, v.local_rank, fix, default=local_default),
        world_size=world,
        local_world_size=local_world,
        node_rank=(env_int(env, v.node_rank, fix, default=rank // per_node) if v.node_rank
                   else rank // per_node),
        master_addr=env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
        master_port=_port(env, DEFAULT_MASTER_PORT),
    )


def _validate(e: DistEnv) -> DistEnv:
    names = LAUNCHER_VARS.get(e.launcher)
    if names is None:
        return e
    rank_n, world_n, local_n, local_world_n = names.names[:4]
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
