"""Process-group setup on top of torch.distributed, with errors that say what to do."""

from __future__ import annotations

import ipaddress
import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from splitsync.distributed.env import DistEnv
from splitsync.distributed.ports import (
    free_port,  # re-exported: tests and testing.spawn use it here
)
from splitsync.errors import GroupError

__all__ = ["init_group", "destroy_group", "default_store", "GroupError", "free_port"]


# Rank 0 writes its job here; the others check it, so that a rank which reached another
# job's store (two jobs, one port) stops at once instead of joining that job's group.
JOB_KEY = "splitsync/job"


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _store(env: DistEnv, timeout: timedelta) -> Any:
    """The rendezvous store of a launcher without an agent (srun, mpirun, one pod each).

    Rank 0 serves it: on a loopback address, from a socket bound to loopback only (a
    TCPStore left to bind alone listens on every interface).
    """
    host, port = env.master_addr, env.master_port
    if env.rank != 0:
        store = dist.TCPStore(host, port, env.world_size, is_master=False,
                              timeout=timeout, wait_for_workers=False)
        store.wait([JOB_KEY])
        owner = store.get(JOB_KEY).decode()
        if owner != env.job_id:
            raise GroupError(
                f"{host}:{port} is the rendezvous of another job ({owner or 'unnamed'}), not "
                f"of this one ({env.job_id or 'unnamed'}): two jobs share the port. Give "
                "each job its own MASTER_PORT.")
        return store
    fd = None
    if _is_loopback(host):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            # a listener on the port fails here (EADDRINUSE, explained like the store's own);
            # closed connections of an earlier run (TIME_WAIT) do not, as in TCPStore
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            fd = sock.detach()  # the store owns the socket from here on and closes it
    try:
        store = dist.TCPStore(host, port, env.world_size, is_master=True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=fd)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    store.set(JOB_KEY, env.job_id)
    return store


def init_group(env: DistEnv, backend: str, device: torch.device, timeout: timedelta) -> bool:
    """Initialise the default process group; returns True if this call created it."""
    if dist.is_initialized():
        if dist.get_world_size() != env.world_size:
            raise GroupError(
                f"A process group of size {dist.get_world_size()} already exists but the "
                f"launcher says WORLD_SIZE={env.world_size}."
            )
        return False
    if not dist.is_available():
        raise GroupError("This PyTorch build has no torch.distributed; install a build with it.")
    if backend == "nccl" and not dist.is_nccl_available():
        raise GroupError("backend='nccl' is not available in this PyTorch build; use 'gloo'.")
    if backend == "gloo" and not dist.is_gloo_available():
        raise GroupError("backend='gloo' is not available in this PyTorch build.")
    kwargs: dict[str, object] = {}
    if device.type in ("cuda", "xpu"):
        kwargs["device_id"] = device  # eager init, binds the communicator to this device
    try:
        # torchrun's agent already runs a store and tells workers to reuse it (env://)
        where: dict[str, Any] = ({"init_method": "env://"} if env.launcher in ("torchrun", "env")
                                 else {"store": _store(env, timeout)})
        dist.init_process_group(
            backend=backend,
            **where,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            **kwargs,  # type: ignore[arg-type]
        )
    except GroupError:
        raise
    except (RuntimeError, ValueError, OSError) as exc:
        raise GroupError(_explain(exc, env, backend)) from exc
    if dist.get_world_size() != env.world_size:  # never train with fewer ranks than launched
        got = dist.get_world_size()
        dist.destroy_process_group()
        raise GroupError(f"Launched with WORLD_SIZE={env.world_size} but the group has {got}.")
    return True


def _explain(exc: BaseException, env: DistEnv, backend: str) -> str:
    text = str(exc)
    where = f"{env.master_addr}:{env.master_port}"
    if "address already in use" in text.lower() or "EADDRINUSE" in text:
        derived = (f" (derived from {env.launcher} job {env.job_id}, as MASTER_PORT is "
                   "unset: another job or program holds it)" if env.port_derived else "")
        return (
            f"MASTER_PORT={env.master_port} is already in use on {env.master_addr}{derived}. "
            "Pick a free port (MASTER_PORT=...) or let `splitsync run` choose one."
        )
    if "timed out" in text.lower() or "timeout" in text.lower():
        return (
            f"Rank {env.rank} timed out waiting for the other {env.world_size - 1} rank(s) at "
            f"{where}. Check that every rank was started, that MASTER_ADDR/MASTER_PORT agree "
            "on all of them and that the port is reachable."
        )
    return f"Could not form the {backend} process group at {where} as rank {env.rank}: {text}"


def destroy_group() -> None:
    """Destroy the default group if one exists."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def default_store() -> Any | None:
    """The store the default group was formed with (None without a group, or where PyTorch
    hides it)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # a private accessor: callers do without the store
        return None
