"""Turn a checked :class:`~splitsync.launch.spec.LaunchSpec` into torchrun's command line."""

from __future__ import annotations

import shlex

from splitsync.launch.spec import LaunchSpec
from splitsync.preemption.defaults import AGENT_SIGNALS

__all__ = ["torchrun_argv", "torchrun_command", "MAX_READ_TIMEOUT", "AGENT_SIGNALS"]

MAX_READ_TIMEOUT = 60  # torchrun's default store read timeout
# AGENT_SIGNALS (the signals the agent passes on to its workers) comes from the preemption
# defaults: torchrun's own list plus every signal a run stops on by default.


def _rdzv_conf(spec: LaunchSpec) -> str:
    # join_timeout bounds the whole rendezvous; read_timeout bounds reaching the store, so an
    # unreachable endpoint fails within the same limit instead of torchrun's fixed 60 s.
    conf = {"join_timeout": str(spec.rdzv_timeout),
            "read_timeout": str(min(spec.rdzv_timeout, MAX_READ_TIMEOUT))}
    if not spec.single_node and spec.node_rank not in (None, 0):
        conf["is_host"] = "false"  # only node rank 0 may host the store (no race on one host)
    for pair in spec.rdzv_conf:  # the user's own settings win
        key, _, value = pair.partition("=")
        conf[key.strip()] = value.strip()
    return ",".join(f"{k}={v}" for k, v in conf.items())


def torchrun_argv(spec: LaunchSpec) -> list[str]:
    """Arguments for ``torch.distributed.run.main`` (torchrun's command line)."""
    if spec.rdzv_port == 0:
        raise ValueError("choose the rendezvous port before building torchrun's argv")
    nnodes = str(spec.max_nodes) if spec.min_nodes == spec.max_nodes else (
        f"{spec.min_nodes}:{spec.max_nodes}")
    argv = [
        "--nnodes", nnodes,
        "--nproc-per-node", str(spec.nproc_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", spec.endpoint,
        "--rdzv-id", spec.rdzv_id,
        "--rdzv-conf", _rdzv_conf(spec),
        "--max-restarts", str(spec.max_restarts),
        "--signals-to-handle", AGENT_SIGNALS,
        "--shutdown-timeout", str(spec.shutdown_timeout),
    ]
    if spec.loopback:
        # Workers are told this address for the shared store: keep it on loopback too.
        argv += ["--local-addr", "127.0.0.1" if ":" not in spec.rdzv_host else "::1"]
    if spec.monitor_interval is not None:
        argv += ["--monitor-interval", str(spec.monitor_interval)]
    if spec.module:
        argv.append("--module")
    return [*argv, spec.script, *spec.script_args]


def torchrun_command(spec: LaunchSpec) -> str:
    """The equivalent shell command, environment variables first."""
    env = [f"{k}={shlex.quote(v)}" for k, v in spec.env]
    return " ".join([*env, "torchrun", *(shlex.quote(a) for a in torchrun_argv(spec))])
