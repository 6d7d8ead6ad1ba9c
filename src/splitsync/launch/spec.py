"""Validate ``splitsync run`` options into a checked :class:`LaunchSpec`.

torchrun's elastic agent does all the work (c10d rendezvous, worker processes, restarts);
this module only turns the user's options, plus what a cluster manager already says, into
a spec (``launch.argv`` then turns it into torchrun's command line). Pure apart from
reading the file system (does the script exist?) and the interface list.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from splitsync.errors import LaunchError
from splitsync.launch.cluster import DEFAULT_RDZV_PORT, ClusterDefaults
from splitsync.preemption.defaults import DEFAULT_SHUTDOWN_TIMEOUT  # the grace, and a margin

__all__ = [
    "LaunchError", "LaunchSpec", "build_spec", "parse_nnodes", "parse_nproc", "parse_endpoint",
    "is_loopback", "format_endpoint", "loopback_interface", "DEFAULT_RDZV_TIMEOUT",
    "DEFAULT_SHUTDOWN_TIMEOUT",
]

DEFAULT_RDZV_TIMEOUT = 600  # seconds; torchrun's own join timeout


@dataclass(frozen=True)
class LaunchSpec:
    """Everything one ``splitsync run`` on one node hands to torchrun."""

    script: str
    script_args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int | None = None
    rdzv_host: str = "127.0.0.1"
    rdzv_port: int = 0  # 0: choose a free port when launching (single node only)
    rdzv_id: str = "splitsync"
    rdzv_timeout: int = DEFAULT_RDZV_TIMEOUT
    max_restarts: int = 0
    monitor_interval: float | None = None
    shutdown_timeout: int = DEFAULT_SHUTDOWN_TIMEOUT
    rdzv_conf: tuple[str, ...] = ()  # extra key=value pairs for torchrun's --rdzv-conf
    module: bool = False
    env: tuple[tuple[str, str], ...] = ()  # variables the workers get (exported by the agent)
    notes: tuple[str, ...] = field(default=(), compare=False)  # told to the user once
    source: str = "command line"  # where multi-node settings came from

    @property
    def single_node(self) -> bool:
        """True when at most one node takes part."""
        return self.max_nodes == 1

    @property
    def loopback(self) -> bool:
        """True when the rendezvous is on this machine's loopback interface."""
        return is_loopback(self.rdzv_host)

    @property
    def hosts_rendezvous(self) -> bool:
        """Whether this node is expected to run the rendezvous store (node rank 0)."""
        return self.single_node or self.node_rank in (None, 0)

    @property
    def endpoint(self) -> str:
        """``host:port`` of the rendezvous."""
        return format_endpoint(self.rdzv_host, self.rdzv_port)


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def format_endpoint(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_nnodes(text: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4)."""
    fix = "Use --nnodes N or --nnodes MIN:MAX with 1 <= MIN <= MAX, e.g. --nnodes 1:4."
    parts = str(text).split(":")
    if len(parts) not in (1, 2):
        raise LaunchError(f"--nnodes {text!r} is not N or MIN:MAX. {fix}")
    try:
        low, high = (int(parts[0]), int(parts[-1]))
    except ValueError:
        raise LaunchError(f"--nnodes {text!r} is not a number or a range. {fix}") from None
    if low < 1 or high < low:
        raise LaunchError(f"--nnodes {text}: the range is empty or starts below 1. {fix}")
    return low, high


def parse_nproc(text: str, accelerators: int) -> int:
    """``"auto"`` -> visible accelerators (1 without any); else a positive integer."""
    if str(text).strip().lower() == "auto":
        return max(1, accelerators)
    try:
        n = int(text)
    except ValueError:
        raise LaunchError(
            f"-n/--nproc-per-node {text!r} is not a number. Use a positive integer, or "
            "'auto' for one process per visible GPU (1 on a machine without one)."
        ) from None
    if n < 1:
        raise LaunchError(
            f"-n/--nproc-per-node {n}: at least one process per node is needed. Use -n 1 or "
            "more, or -n auto."
        )
    return n


def parse_endpoint(text: str, default_port: int = DEFAULT_RDZV_PORT) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``, or ``host`` alone for the default port) -> (host, port)."""
    text = text.strip()
    fix = "Use --rdzv-endpoint HOST:PORT, e.g. --rdzv-endpoint node0:29400 (the address of node 0)."
    if not text:
        raise LaunchError(f"--rdzv-endpoint is empty. {fix}")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise LaunchError(f"--rdzv-endpoint {text!r} has no host. {fix}")
    if not port_text:
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise LaunchError(f"--rdzv-endpoint {text!r}: port {port_text!r} is not a number. {fix}") from None
    if not 0 < port < 65536:
        raise LaunchError(f"--rdzv-endpoint {text!r}: port {port} is outside 1-65535. {fix}")
    return host, port


def _conf_pairs(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    pairs = tuple(p.strip() for p in text.split(",") if p.strip())
    for pair in pairs:
        if "=" not in pair or not pair.split("=", 1)[0]:
            raise LaunchError(
                f"--rdzv-conf {text!r}: {pair!r} is not key=value. Use e.g. "
                "--rdzv-conf last_call_timeout=5,keep_alive_interval=2."
            )
    return pairs


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def loopback_interface() -> str | None:
    """Name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS), if any."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def _worker_env(environ: Mapping[str, str], nproc: int, loopback: bool,
                cores: int) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    env: list[tuple[str, str]] = []
    notes: list[str] = []
    if not environ.get("OMP_NUM_THREADS"):
        # Each process would otherwise start one OpenMP thread per core: N times oversubscribed.
        threads = max(1, cores // nproc)
        env.append(("OMP_NUM_THREADS", str(threads)))
        notes.append(f"OMP_NUM_THREADS={threads} ({cores} CPU core(s) / {nproc} process(es) per "
                     "node); set OMP_NUM_THREADS yourself to change it.")
    if loopback and not environ.get("GLOO_SOCKET_IFNAME"):
        name = loopback_interface()
        if name:  # keep gloo's sockets off the other interfaces as well
            env.append(("GLOO_SOCKET_IFNAME", name))
    return tuple(env), tuple(notes)


def build_spec(*, script: str, script_args: Sequence[str] = (), nproc: str = "1",
               nnodes: str | None = None, node_rank: int | None = None,
               rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
               rdzv_timeout: int = DEFAULT_RDZV_TIMEOUT, rdzv_conf: str | None = None,
               max_restarts: int = 0, monitor_interval: float | None = None,
               shutdown_timeout: int = DEFAULT_SHUTDOWN_TIMEOUT, module: bool = False, environ: Mapping[str, str] | None = None,
               accelerators: int = 0, cluster: ClusterDefaults | None = None,
               cores: int | None = None) -> LaunchSpec:
    """Check every option and fill in what the cluster manager knows; raises LaunchError."""
    environ = os.environ if environ is None else environ
    cluster = cluster or ClusterDefaults(source="none")
    if not module and not os.path.isfile(script):
        where = os.path.abspath(script)
        raise LaunchError(f"script {script!r} not found (looked for {where}). Give the path of "
                          "a Python file, e.g. `splitsync run -n 2 train.py`.")
    nproc_per_node = parse_nproc(nproc, accelerators)
    used_cluster = False
    if nnodes is None and cluster.nnodes is not None:
        nnodes, used_cluster = cluster.nnodes, True
    low, high = parse_nnodes(nnodes or "1")
    if max_restarts < 0:
        raise LaunchError(f"--max-restarts {max_restarts}: must be 0 or more.")
    if rdzv_timeout <= 0:
        raise LaunchError(f"--rdzv-timeout {rdzv_timeout}: must be a positive number of seconds.")
    if monitor_interval is not None and monitor_interval <= 0:
        raise LaunchError(f"--monitor-interval {monitor_interval}: must be positive.")
    if shutdown_timeout < 0:
        raise LaunchError(f"--shutdown-timeout {shutdown_timeout}: must be 0 or more seconds.")
    if high > 1:
        if node_rank is None and cluster.node_rank is not None:
            node_rank, used_cluster = cluster.node_rank, True
        if rdzv_endpoint is None and cluster.endpoint is not None:
            rdzv_endpoint, used_cluster = cluster.endpoint, True
        if rdzv_id is None and cluster.rdzv_id is not None:
            rdzv_id = cluster.rdzv_id
        if rdzv_endpoint is None:
            raise LaunchError(
                f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, the address of node 0 "
                "that every node can reach (e.g. --rdzv-endpoint node0:29400). Start the same "
                "command on every node."
            )
    if node_rank is not None and not 0 <= node_rank < high:
        raise LaunchError(f"--node-rank {node_rank}: must be between 0 and {high - 1} "
                          f"for --nnodes {nnodes}.")
    if rdzv_endpoint is not None:
        host, port = parse_endpoint(rdzv_endpoint)
    else:
        host, port = "127.0.0.1", 0
    single = high == 1
    env, notes = _worker_env(environ, nproc_per_node, is_loopback(host),
                             cores if cores is not None else _cpu_count())
    return LaunchSpec(
        script=script, script_args=tuple(script_args), nproc_per_node=nproc_per_node,
        min_nodes=low, max_nodes=high, node_rank=None if single else node_rank,
        rdzv_host=host, rdzv_port=port,
        rdzv_id=rdzv_id or (f"splitsync-{uuid.uuid4().hex[:12]}" if single else "splitsync"),
        rdzv_timeout=int(rdzv_timeout), max_restarts=max_restarts,
        monitor_interval=monitor_interval, shutdown_timeout=int(shutdown_timeout),
        rdzv_conf=_conf_pairs(rdzv_conf), module=module,
        env=env, notes=notes, source=cluster.source if used_cluster else "command line",
    )
