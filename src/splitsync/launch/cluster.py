"""Multi-node defaults for ``splitsync run`` read from the cluster manager's environment.

Inside a SLURM allocation (one ``splitsync run`` per node, started by ``srun``) and inside a
Kubeflow PyTorchJob pod, the number of nodes, this node's rank and the rendezvous endpoint
are already known; ``splitsync run`` takes them from here unless given on the command line.
Pure functions over a mapping so every environment can be recorded and tested.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from splitsync.distributed.env import LAUNCHER_VARS
from splitsync.distributed.parsing import EnvError, first_host, optional_int, slurm_nodelist

__all__ = ["ClusterDefaults", "launch_defaults", "DEFAULT_RDZV_PORT"]

DEFAULT_RDZV_PORT = 29400  # torchrun's default c10d port


@dataclass(frozen=True)
class ClusterDefaults:
    """What the cluster manager says about this node; ``None`` means "not known"."""

    source: str  # "slurm", "kubernetes" or "none"
    nnodes: str | None = None  # "N" or "MIN:MAX"
    node_rank: int | None = None
    endpoint: str | None = None  # host:port
    rdzv_id: str | None = None
    nproc_per_node: str | None = None  # "N" or "auto"


_FIX = "Fix or unset it."
SLURM = LAUNCHER_VARS["slurm"]


def _number(env: Mapping[str, str], name: str) -> int | None:
    return optional_int(env, name, _FIX)


def _slurm(env: Mapping[str, str]) -> ClusterDefaults:
    nodelist = slurm_nodelist(env)
    nnodes = _number(env, "SLURM_STEP_NUM_NODES") or _number(env, "SLURM_NNODES") or _number(
        env, "SLURM_JOB_NUM_NODES")
    job = env.get("SLURM_JOB_ID", "").strip()
    local_id = SLURM.local_rank
    if (_number(env, local_id) or 0) > 0:
        raise EnvError(
            f"{local_id}={env[local_id]}: `splitsync run` was started more than once on "
            "this node. Start one per node (`srun --ntasks-per-node=1 splitsync run -n GPUS ...`) "
            "or let srun start the workers itself (`srun python train.py`)."
        )
    host = env.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else None)
    port = _number(env, "MASTER_PORT") or DEFAULT_RDZV_PORT
    return ClusterDefaults(
        source="slurm",
        nnodes=str(nnodes) if nnodes else None,
        node_rank=_number(env, SLURM.node_rank),
        endpoint=f"{host}:{port}" if host else None,
        rdzv_id=f"slurm-{job}" if job else None,
    )


def _kubernetes(env: Mapping[str, str]) -> ClusterDefaults:
    # The training operator passes torchrun's own settings as PET_* variables.
    host = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    port = _number(env, "PET_MASTER_PORT") or _number(env, "MASTER_PORT") or DEFAULT_RDZV_PORT
    nnodes = env.get("PET_NNODES", "").strip() or None  # "N" or "MIN:MAX", as torchrun takes
    return ClusterDefaults(
        source="kubernetes",
        nnodes=nnodes,
        node_rank=_number(env, "PET_NODE_RANK"),
        endpoint=f"{host}:{port}" if host else None,
        rdzv_id=env.get("PET_RDZV_ID") or None,
        nproc_per_node=env.get("PET_NPROC_PER_NODE", "").strip() or None,
    )


def launch_defaults(env: Mapping[str, str]) -> ClusterDefaults:
    """Defaults for ``splitsync run`` from a SLURM allocation or a PyTorchJob pod.

    Only a SLURM *allocation* counts (SLURM_JOB_ID): ``srun`` with one task per node starts
    one ``splitsync run`` per node. A PyTorchJob pod is recognised by the operator's PET_*
    variables.
    """
    if env.get("SLURM_JOB_ID") and (env.get(SLURM.node_rank) is not None):
        return _slurm(env)
    if any(k.startswith("PET_") for k in env) and env.get("KUBERNETES_SERVICE_HOST"):
        return _kubernetes(env)
    return ClusterDefaults(source="none")
