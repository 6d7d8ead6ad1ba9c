"""Who am I: rank, world size and rendezvous address, read from the launcher's environment.

Pure functions over a mapping (``os.environ`` by default) so that every launcher's
environment can be recorded and tested without starting a process group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from splitsync.distributed.mpi import derived_port, mpich_job, openmpi_job
from splitsync.distributed.parsing import (
    EnvError,
    env_int,
    first_host,
    slurm_nodelist,
    slurm_tasks_per_node,
)

__all__ = ["DistEnv", "EnvError", "detect_env", "slurm_master_addr", "first_host",
           "LauncherVars", "LAUNCHER_VARS", "TORCHRUN", "launched_env", "batch_note"]

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
    # OMPI_COMM_WORLD_NODE_RANK is not the node: it is the rank within the node.
    "openmpi": LauncherVars("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
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
    job_id: str = ""  # the launcher's job (SLURM job.step, MPI job); "" under torchrun
    port_derived: bool = False  # master_port comes from job_id, not from MASTER_PORT

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


def _read(env: Mapping[str, str], peer: bool) -> DistEnv:
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
    slurm = _slurm(env) if _in_srun_step(env) else None
    mpi = _mpi_launcher(env)
    if mpi is not None and (slurm is None or _mpi_rank_world(env, mpi) != (
            slurm.rank, slurm.world_size)):
        # Inside an allocation, mpirun starts its daemons with srun (one task per node) and
        # the ranks inherit a daemon's SLURM_PROCID: the MPI launcher is the inner one. srun
        # starting MPI ranks itself (--mpi=pmi2) gives both the same rank and size.
        return _mpi(env, mpi, peer)
    return slurm or DistEnv(launcher="none")


def _mpi_launcher(env: Mapping[str, str]) -> str | None:
    if LAUNCHER_VARS["openmpi"].rank in env:
        return "openmpi"
    v = LAUNCHER_VARS["mpich"]
    return "mpich" if v.rank in env and v.world_size in env else None


def _mpi_rank_world(env: Mapping[str, str], launcher: str) -> tuple[int, int]:
    v = LAUNCHER_VARS[launcher]
    return (env_int(env, v.rank, _MPI_FIX[launcher]),
            env_int(env, v.world_size, _MPI_FIX[launcher]))


def _in_srun_step(env: Mapping[str, str]) -> bool:
    """True in a task that srun started. A batch script also carries SLURM_PROCID=0 and the
    allocation's SLURM_NTASKS, but no step id: a `python train.py` there is one process."""
    v = LAUNCHER_VARS["slurm"]
    return v.rank in env and v.world_size in env and bool(env.get("SLURM_STEP_ID", "").strip())


def batch_note(env: Mapping[str, str], detected: DistEnv) -> str | None:
    """What to say when a SLURM batch script runs the script itself, not through srun."""
    raw = env.get(LAUNCHER_VARS["slurm"].world_size, "").strip()
    tasks = int(raw) if raw.isdigit() else 0
    if detected.launcher != "none" or tasks < 2 or not env.get("SLURM_JOB_ID"):
        return None
    return (f"one process, not {tasks}: this SLURM job has {tasks} tasks, but runs outside an "
            "srun step. Start it with `srun python ...` (or `srun splitsync run ...` with "
            "--ntasks-per-node=1) to use them.")


def _slurm_local_world(env: Mapping[str, str], node: int, world: int, fix: str) -> int:
    """Tasks on this node. The step's layout first: the job's SLURM_NTASKS_PER_NODE is what
    sbatch asked for and stays set in a smaller srun step inside it."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name, "").strip():
            counts = slurm_tasks_per_node(name, env[name])
            if node >= len(counts):
                raise EnvError(f"SLURM_NODEID={node} but {name}={env[name]!r} lists "
                               f"{len(counts)} node(s). {fix}")
            return counts[node]
    per_node = env_int(env, LAUNCHER_VARS["slurm"].local_world_size, fix, default=0)
    if per_node:
        return per_node
    nodes = env_int(env, "SLURM_STEP_NUM_NODES", fix, default=0) or env_int(
        env, "SLURM_NNODES", fix, default=1) or 1
    return max(1, world // nodes)


def _slurm(env: Mapping[str, str]) -> DistEnv:
    v = LAUNCHER_VARS["slurm"]
    fix = "Run inside an srun step, or unset the SLURM_* variables."
    world = env_int(env, v.world_size, fix)
    node = env_int(env, v.node_rank, fix, default=0)
    job = env.get("SLURM_JOB_ID", "").strip()
    return DistEnv(
        launcher="slurm",
        rank=env_int(env, v.rank, fix),
        local_rank=env_int(env, v.local_rank, fix, default=0),
        world_size=world,
        local_world_size=_slurm_local_world(env, node, world, fix),
        node_rank=node,
        master_addr=slurm_master_addr(env),
        master_port=_slurm_port(env),
        job_id=f"slurm-{job}.{env.get('SLURM_STEP_ID', '').strip()}" if job else "",
        port_derived=not env.get("MASTER_PORT"),
    )


def _mpi(env: Mapping[str, str], launcher: str, peer: bool) -> DistEnv:
    """Open MPI's or MPICH's variables. Neither gives a node index (Open MPI's
    OMPI_COMM_WORLD_NODE_RANK is the rank within the node), nor MPICH a local rank: both
    follow from the rank and the processes per node, as mpirun places ranks by default
    (by slot: node 0 gets ranks 0..L-1)."""
    v, fix = LAUNCHER_VARS[launcher], _MPI_FIX[launcher]
    rank, world = _mpi_rank_world(env, launcher)
    local_world = env_int(env, v.local_world_size, fix, default=world)
    per_node = max(local_world, 1)
    local_default = 0 if launcher == "openmpi" else rank % per_node
    job = openmpi_job(env) if launcher == "openmpi" else (mpich_job(env) if peer else None)
    return DistEnv(
        launcher=launcher,
        rank=rank,
        local_rank=env_int(env, v.local_rank, fix, default=local_default),
        world_size=world,
        local_world_size=local_world,
        node_rank=rank // per_node,
        master_addr=env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR,
        master_port=_mpi_port(env, launcher, job, world, local_world),
        job_id=job or "",
        port_derived=bool(job) and not env.get("MASTER_PORT"),
    )


def _mpi_port(env: Mapping[str, str], launcher: str, job: str | None, world: int,
              local_world: int) -> int:
    if env.get("MASTER_PORT") or (world == 1 and job is None):
        return _port(env, DEFAULT_MASTER_PORT)
    if job is None:
        raise EnvError(f"{launcher}: no job id to derive a rendezvous port from. Set "
                       "MASTER_PORT to a free TCP port, the same for every rank "
                       "(mpirun -x MASTER_PORT=... / mpiexec -genv MASTER_PORT ...).")
    if launcher == "mpich" and local_world < world:
        raise EnvError("mpich: a job on several nodes needs MASTER_ADDR and MASTER_PORT "
                       "(mpiexec -genv MASTER_ADDR node0 -genv MASTER_PORT 29500): MPICH "
                       "names no job that every node shares.")
    return derived_port(job)


_MPI_FIX = {
    "openmpi": "Launch with mpirun, or unset the OMPI_COMM_WORLD_* variables.",
    "mpich": "Launch with mpiexec (MPICH/Intel MPI), or unset the PMI_* variables.",
}


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
    """Read and validate the launcher environment; never touches the network.

    This process's own environment (the default, or ``os.environ`` itself) also gives
    MPICH's job id, from this process's PMI socket (see ``distributed.mpi``); any other mapping
    (a recorded environment) is read alone.
    """
    real = environ is None or environ is os.environ
    return _validate(_read(os.environ if environ is None else environ, peer=real))
