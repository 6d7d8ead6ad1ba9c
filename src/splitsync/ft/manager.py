"""The one place that imports torchft, and the Manager of this process's replica group.

torchft is imported only here and only when a run asks for it: importing it sets up Rust
logging to stderr (read from ``RUST_LOG`` at import time) and OpenTelemetry loggers.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

import torch

from splitsync.distributed.logs import get_logger
from splitsync.ft.options import TORCHFT_VERSION, FTOptions

__all__ = ["import_torchft", "build_manager", "on_loopback"]


def import_torchft() -> ModuleType:
    """torchft, imported with its Rust log quiet unless the user set ``RUST_LOG``; a clear
    error naming the extra when it is missing."""
    os.environ.setdefault("RUST_LOG", "warn")  # torchft reads it once, at import
    try:
        module = importlib.import_module("torchft")
    except ImportError as exc:
        raise ImportError(
            "init(fault_tolerance='torchft') needs torchft: pip install 'splitsync[ft]' "
            f"(installs torchft=={TORCHFT_VERSION}, the version splitsync is tested with)."
        ) from exc
    try:
        from importlib.metadata import version

        found = version("torchft")
    except Exception:  # an unusual install: nothing to compare
        found = TORCHFT_VERSION
    if found != TORCHFT_VERSION:
        get_logger().warning("torchft %s is installed; splitsync's fault tolerance is tested "
                             "with %s (pip install 'splitsync[ft]')", found, TORCHFT_VERSION)
    return module


def on_loopback(address: str) -> bool:
    """Whether a ``http://host:port`` address is on this machine's loopback interface."""
    host = urlparse(address if "://" in address else f"http://{address}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def _manager_server_on_loopback(manager_module: ModuleType) -> Iterator[None]:
    # torchft 0.2.0 hard-codes ``bind = f"[::]:{port}"`` for the group's gRPC ManagerServer
    # (every interface); the one seam is the constructor Manager.__init__ calls by keyword.
    real = manager_module.ManagerServer

    def server(**kwargs: Any) -> Any:
        kwargs["bind"] = str(kwargs["bind"]).replace("[::]", "127.0.0.1")
        return real(**kwargs)

    manager_module.ManagerServer = server
    try:
        yield
    finally:
        manager_module.ManagerServer = real


def _process_group(torchft: ModuleType, backend: str, timeout: timedelta) -> Any:
    if backend == "nccl":
        return torchft.ProcessGroupNCCL(timeout=timeout)
    if backend != "gloo":
        raise ValueError(f"fault_tolerance='torchft' averages across groups over gloo or nccl; "
                         f"this run uses backend {backend!r}.")
    return torchft.ProcessGroupGloo(timeout=timeout)


def build_manager(options: FTOptions, *, rank: int, world_size: int, store_addr: str,
                  store_port: int, device: torch.device, backend: str,
                  load_state_dict: Callable[[Any], None],
                  state_dict: Callable[[], Any]) -> Any:
    """The group's :class:`torchft.Manager`: synchronous quorums (a recovering group loads
    its peer's state before its first batch), live recovery over the cross-group process
    group (``PGTransport``: never an HTTP server on every interface), and on a loopback
    Lighthouse every server it starts bound to loopback."""
    torchft = import_torchft()
    manager_module = importlib.import_module("torchft.manager")
    transport_module = importlib.import_module("torchft.checkpointing.pg_transport")
    timeout = timedelta(seconds=options.timeout)
    pg = _process_group(torchft, backend, timeout)
    transport = transport_module.PGTransport(pg, timeout=timeout, device=device)
    kwargs: dict[str, Any] = dict(
        pg=pg, load_state_dict=load_state_dict, state_dict=state_dict,
        min_replica_size=options.min_replicas, use_async_quorum=False, timeout=timeout,
        quorum_timeout=timedelta(seconds=options.quorum_timeout), connect_timeout=timeout,
        rank=rank, world_size=world_size, store_addr=store_addr, store_port=store_port,
        lighthouse_addr=options.lighthouse, replica_id=options.replica_id,
        heartbeat_interval=timedelta(milliseconds=options.heartbeat_ms),
        checkpoint_transport=transport)
    if not on_loopback(options.lighthouse):
        return torchft.Manager(**kwargs)
    kwargs["hostname"] = "127.0.0.1"  # what the Lighthouse tells peers to connect to
    with _manager_server_on_loopback(manager_module):
        return torchft.Manager(**kwargs)
