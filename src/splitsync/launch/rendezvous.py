"""Hold the rendezvous port for ``splitsync run`` and keep loopback runs on loopback.

torchrun's c10d rendezvous creates its TCPStore servers without a listen address, so they
accept connections on every interface. TCPStore does accept an already bound socket
(``master_listen_fd``) and shares one server per port inside a process (``multi_tenant``):
for a rendezvous on loopback, ``splitsync run`` starts the store itself on a socket bound to
loopback, and torchrun's backend, running in the same process, reuses it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

from splitsync.launch.spec import LaunchError, LaunchSpec

__all__ = ["reserve_endpoint", "loopback_store", "bind_or_explain", "wait_for_endpoint"]


def bind_or_explain(family: int, host: str, port: int, spec: LaunchSpec) -> socket.socket:
    """A listening socket on (host, port), or LaunchError naming the port and the fix."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise LaunchError(
            f"port {port} on {spec.rdzv_host} is already in use ({exc.strerror}), so the "
            f"rendezvous cannot listen on {spec.endpoint}. Pick another port with "
            "--rdzv-endpoint HOST:PORT, or stop the process that holds it"
            + (" (leave out --rdzv-endpoint and a free port is chosen)." if spec.single_node
               else ".")
        ) from None
    return sock


def loopback_store(host: str, port: int, timeout: timedelta, spec: LaunchSpec) -> Any:
    """A TCPStore server listening on ``host`` (a loopback address) only."""
    from torch.distributed import TCPStore

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = bind_or_explain(family, host, port, spec)
    port = int(sock.getsockname()[1])
    fd = sock.detach()  # the store owns the socket from here on and closes it
    try:
        return TCPStore(host, port, is_master=True, multi_tenant=True, master_listen_fd=fd,
                        wait_for_workers=False, timeout=timeout)
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def _workers_store_on_loopback(host: str, spec: LaunchSpec) -> Iterator[None]:
    # The agent of the node with rank 0 starts a second server for the workers' bootstrap
    # (DynamicRendezvousHandler._create_tcp_store_server). Give it a loopback socket too.
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler as Handler,
        )
    except ImportError:
        yield
        return
    original: Callable[..., Any] | None = getattr(Handler, "_create_tcp_store_server", None)
    if original is None:
        yield
        return
    timeout = timedelta(seconds=spec.rdzv_timeout)

    def create(self: Any, master_addr: str, master_port: int) -> Any:
        return loopback_store(host, int(master_port), timeout, spec)

    Handler._create_tcp_store_server = create  # type: ignore[method-assign]
    try:
        yield
    finally:
        Handler._create_tcp_store_server = original  # type: ignore[method-assign]


def _host_on_loopback(host: str, spec: LaunchSpec) -> Any:
    try:
        return loopback_store(host, spec.rdzv_port, timedelta(seconds=spec.rdzv_timeout), spec)
    except LaunchError:
        if spec.single_node or spec.node_rank is not None:
            raise
        return None  # no --node-rank: like torchrun, be a client when another node hosts


@contextmanager
def reserve_endpoint(spec: LaunchSpec) -> Iterator[LaunchSpec]:
    """Hold the rendezvous port for this node; yields the spec with the port filled in.

    On loopback (every single-node run) all stores listen on loopback only. Elsewhere, node
    rank 0 checks that the port is free before torchrun starts, so a clash is reported at
    once instead of after the rendezvous timeout.
    """
    host = "::1" if ":" in spec.rdzv_host else "127.0.0.1"
    if spec.loopback:
        store = _host_on_loopback(host, spec) if spec.hosts_rendezvous else None
        if store is None:  # another node on this machine hosts; our workers' store stays local
            wait_for_endpoint(spec)
        try:
            with _workers_store_on_loopback(host, spec):
                yield spec if store is None else replace(spec, rdzv_port=int(store.port))
        finally:
            del store
        return
    if spec.hosts_rendezvous and _is_local(spec.rdzv_host):
        family = socket.AF_INET6 if ":" in spec.rdzv_host else socket.AF_INET
        bind_or_explain(family, "", spec.rdzv_port, spec).close()
    else:
        wait_for_endpoint(spec)
    yield spec


def wait_for_endpoint(spec: LaunchSpec, clock: Callable[[], float] = time.monotonic) -> None:
    """Wait until the rendezvous host resolves and accepts TCP connections.

    A node that does not host the store probes it first, so that a wrong or unreachable
    ``--rdzv-endpoint`` is reported in one sentence within ``--rdzv-timeout`` seconds,
    instead of after torchrun's retries and C++ traces. Raises LaunchError at the deadline.
    """
    deadline = clock() + spec.rdzv_timeout
    reason = "no answer"
    while True:
        try:
            infos = socket.getaddrinfo(spec.rdzv_host, spec.rdzv_port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            infos, reason = [], "the host name does not resolve"
        for family, kind, proto, _, address in infos:
            try:
                with socket.socket(family, kind, proto) as sock:
                    sock.settimeout(max(0.1, min(2.0, deadline - clock())))
                    sock.connect(address)
                return
            except OSError as exc:
                reason = exc.strerror or type(exc).__name__.lower()
        if clock() >= deadline:
            break
        time.sleep(min(0.5, max(0.0, deadline - clock())))
    here = "" if spec.node_rank not in (None, 0) else (
        f" Node rank 0 normally runs on {spec.rdzv_host} itself, and this machine is not it.")
    raise LaunchError(
        f"could not reach the rendezvous at host {spec.rdzv_host} port {spec.rdzv_port} within "
        f"--rdzv-timeout {spec.rdzv_timeout}s ({reason}).{here} Check that node 0 runs "
        "`splitsync run` with the same --rdzv-endpoint, that the host name resolves on this "
        "node and that the port is open (firewall); `splitsync env` on each node shows its "
        "names and addresses."
    )


def _is_local(host: str) -> bool:
    try:
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

        return bool(_matches_machine_hostname(host))
    except Exception:  # a private helper of torch: never let it break a launch
        return False
