"""The ``splitsync env`` report: what a bug report needs to know about this machine.

``collect()`` returns plain data (JSON-ready); ``render_text()`` formats it for people.
Nothing here starts a process group or touches the network.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

from splitsync.distributed.env import TORCHRUN

__all__ = ["collect", "render_text", "RELEVANT_PREFIXES", "relevant_variables"]

RELEVANT_PREFIXES = (
    "MASTER_", "TORCHELASTIC_", "PET_", "SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_RANK",
    "MPI_LOCAL", "NCCL_", "GLOO_", "TORCH_DISTRIBUTED_", "TORCH_NCCL_", "CUDA_",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "OMP_NUM_THREADS",
    "KUBERNETES_SERVICE_HOST", "SPLITSYNC_",
)
RELEVANT_NAMES = (*TORCHRUN.names, "NODE_RANK", "ROLE_RANK", "GROUP_WORLD_SIZE", "PYTHONPATH")
# Values that may carry secrets are shown as set, never printed.
_HIDDEN = ("TOKEN", "SECRET", "PASSWORD", "KEY")


def relevant_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """Launcher, NCCL/gloo and device variables, sorted; secrets masked."""
    out = {}
    for key in sorted(environ):
        if key in RELEVANT_NAMES or key.startswith(RELEVANT_PREFIXES):
            hidden = any(word in key.upper() for word in _HIDDEN)
            out[key] = "<set>" if hidden else environ[key]
    return out


def _versions() -> dict[str, Any]:
    import torch

    from splitsync.version import __version__

    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # NCCL missing from this build
            nccl = None
    return {
        "splitsync": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "platform": platform.platform(),
        "executable": sys.executable,
    }


def _devices() -> list[dict[str, Any]]:
    import torch

    devices: list[dict[str, Any]] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            devices.append({"device": f"cuda:{i}", "name": p.name,
                            "memory_gib": round(p.total_memory / 2**30, 2),
                            "capability": f"{p.major}.{p.minor}"})
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        for i in range(xpu.device_count()):
            p = xpu.get_device_properties(i)
            devices.append({"device": f"xpu:{i}", "name": p.name,
                            "memory_gib": round(p.total_memory / 2**30, 2)})
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append({"device": "mps", "name": "Apple GPU", "memory_gib": None})
    return devices


def _backends() -> dict[str, bool]:
    import torch.distributed as dist

    if not dist.is_available():
        return {"distributed": False}
    out = {"distributed": True, "gloo": dist.is_gloo_available(),
           "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}
    xccl = getattr(dist, "is_xccl_available", None)
    if xccl is not None:
        out["xccl"] = bool(xccl())
    return out


def _launcher(environ: Mapping[str, str]) -> dict[str, Any]:
    from splitsync.distributed.env import EnvError, detect_env
    from splitsync.launch.cluster import launch_defaults

    try:
        e = detect_env(environ)
        info: dict[str, Any] = {"launcher": e.launcher, "rank": e.rank,
                                "local_rank": e.local_rank, "world_size": e.world_size,
                                "local_world_size": e.local_world_size, "node_rank": e.node_rank,
                                "master_addr": e.master_addr, "master_port": e.master_port}
    except EnvError as exc:
        info = {"launcher": "invalid", "error": str(exc)}
    try:
        c = launch_defaults(environ)
        info["cluster"] = c.source
        if c.source != "none":
            info["splitsync_run_defaults"] = {"nnodes": c.nnodes, "node_rank": c.node_rank,
                                              "rdzv_endpoint": c.endpoint, "rdzv_id": c.rdzv_id}
    except EnvError as exc:
        info["cluster_error"] = str(exc)
    return info


def _network() -> dict[str, Any]:
    host = socket.gethostname()
    try:
        addrs = sorted({a[4][0] for a in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})
    except OSError:
        addrs = []
    try:
        interfaces = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        interfaces = []
    return {"hostname": host, "fqdn": socket.getfqdn(), "addresses": addrs,
            "interfaces": interfaces}


def collect(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The whole report as JSON-ready data."""
    environ = os.environ if environ is None else environ
    return {
        "versions": _versions(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "devices": _devices(),
        "backends": _backends(),
        "launcher": _launcher(environ),
        "network": _network(),
        "environment": relevant_variables(environ),
    }


def render_text(report: Mapping[str, Any]) -> str:
    """A plain-text version, ready to paste into a bug report."""
    v, lines = report["versions"], []
    lines.append("splitsync environment")
    for key in ("splitsync", "python", "torch", "cuda", "hip", "cudnn", "nccl", "platform"):
        if v.get(key) is not None or key in ("cuda", "nccl"):
            lines.append(f"  {key + ':':<11}{v.get(key) if v.get(key) is not None else 'none'}")
    lines.append(f"  {'cpu cores:':<11}{report['cpu_cores']}")
    lines.append("devices")
    if not report["devices"]:
        lines.append("  none (CPU only)")
    for d in report["devices"]:
        mem = f", {d['memory_gib']} GiB" if d.get("memory_gib") is not None else ""
        lines.append(f"  {d['device']}: {d['name']}{mem}")
    lines.append("backends")
    lines.append("  " + ", ".join(f"{k}: {'yes' if ok else 'no'}"
                                  for k, ok in report["backends"].items()))
    launcher = report["launcher"]
    lines.append("launcher")
    for key, value in launcher.items():
        lines.append(f"  {key + ':':<18}{value}")
    net = report["network"]
    lines.append("network")
    lines.append(f"  hostname: {net['hostname']} (fqdn {net['fqdn']})")
    lines.append(f"  addresses: {', '.join(net['addresses']) or 'none resolved'}")
    lines.append(f"  interfaces: {', '.join(net['interfaces']) or 'unknown'}")
    lines.append("environment variables")
    if not report["environment"]:
        lines.append("  none of the launcher, NCCL, gloo or device variables are set")
    for key, value in report["environment"].items():
        lines.append(f"  {key}={value}")
    return "\n".join(lines)
