"""``splitsync run --replica-groups R -n N script.py``: a fault-tolerant job on one machine.

The launcher starts torchft's Lighthouse in this process, bound to loopback, then R replica
groups, each one ``splitsync run -n N`` (torchrun's agent, its own loopback rendezvous and
restarts) told its group by ``REPLICA_GROUP_ID``/``NUM_REPLICA_GROUPS`` and the Lighthouse
by ``TORCHFT_LIGHTHOUSE``. A group whose process dies is restarted by its own agent (up to
``--max-restarts``) while the others train on; it recovers live from them.

The job ends with its first group that finishes: the others are given a grace period to
finish the same last step, then stopped. A group restarted after that would form a quorum
alone and train the job again (it would find nobody to recover from), so no group is left
running once one is done.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from splitsync.launch.agent import say
from splitsync.launch.spec import LaunchError, LaunchSpec

__all__ = ["ReplicaGroups", "run_replica_groups", "group_command", "group_env", "from_command"]


@dataclass(frozen=True)
class ReplicaGroups:
    """What ``--replica-groups`` asked for."""

    groups: int
    nproc: int
    max_restarts: int = 0
    heartbeat_timeout_ms: int = 1000  # the Lighthouse declares a silent group dead after it
    min_replicas: int = 1
    join_timeout_ms: int = 60000  # how long a quorum waits for a live group that has not asked
    grace: float = 10.0  # seconds the other groups get to finish after the first one did
    monitor_interval: float | None = None
    module: bool = False

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ValueError(f"--replica-groups {self.groups}: give 1 or more groups.")
        if self.heartbeat_timeout_ms < 1 or self.min_replicas < 1:
            raise ValueError("--ft-heartbeat-timeout-ms and --ft-min-replicas must be >= 1.")
        if self.min_replicas > self.groups:
            raise ValueError(f"--ft-min-replicas {self.min_replicas} is more than the "
                             f"{self.groups} replica groups: no step could count.")


def group_command(rg: ReplicaGroups, script: str, script_args: Sequence[str]) -> list[str]:
    """One group's ``splitsync run -n N`` (torchrun's agent, loopback, its own port)."""
    cmd = [sys.executable, "-m", "splitsync", "run", "-n", str(rg.nproc),
           "--max-restarts", str(rg.max_restarts)]
    if rg.monitor_interval is not None:
        cmd += ["--monitor-interval", str(rg.monitor_interval)]
    if rg.module:
        cmd.append("-m")
    return [*cmd, script, *script_args]


def group_env(environ: Mapping[str, str], group: int, groups: int, lighthouse: str
              ) -> dict[str, str]:
    """The environment of group ``group``'s agent (and so of its workers)."""
    env = dict(environ)
    env.update(REPLICA_GROUP_ID=str(group), NUM_REPLICA_GROUPS=str(groups),
               TORCHFT_LIGHTHOUSE=lighthouse,
               # restarted workers must not read the dead ones' Manager address from a
               # shared store (they would crash-loop on it)
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    env.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at INFO
    env.setdefault("TOKIO_WORKER_THREADS", "2")  # its threads per process (default: 4)
    return env


def _stop(procs: Mapping[int, subprocess.Popen[bytes]], wait: float = 15.0) -> None:
    """SIGTERM each group's agent (it stops its workers), then SIGKILL what is left."""
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def run_replica_groups(rg: ReplicaGroups, script: str, script_args: Sequence[str]) -> int:
    """Run the job; 0 once a group finished, else the first group's failure status."""
    os.environ.setdefault("RUST_LOG", "warn")
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=rg.min_replicas,
                                  join_timeout_ms=rg.join_timeout_ms, quorum_tick_ms=100,
                                  heartbeat_timeout_ms=rg.heartbeat_timeout_ms)
    # address() names the host; the server listens on 127.0.0.1 only
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    say(f"torchft Lighthouse at {address}; {rg.groups} replica group(s) of {rg.nproc} "
        f"process(es), each restarted up to {rg.max_restarts} time(s)")
    procs: dict[int, subprocess.Popen[bytes]] = {}
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for g in range(rg.groups):
            procs[g] = subprocess.Popen(group_command(rg, script, script_args),
                                        env=group_env(os.environ, g, rg.groups, address),
                                        start_new_session=True)
        return _watch(rg, procs, stopping)
    finally:
        _stop(procs)
        for s, handler in old.items():
            signal.signal(s, handler)
        lighthouse.shutdown()


def _watch(rg: ReplicaGroups, procs: dict[int, subprocess.Popen[bytes]],
           stopping: list[int]) -> int:
    finished_at: float | None = None
    failures: dict[int, int] = {}
    while True:
        if stopping:
            say(f"stopped by {signal.Signals(stopping[0]).name}; stopping every group.")
            return 128 + stopping[0]
        for g, p in procs.items():
            rc = p.poll()
            if rc is None or g in failures:
                continue
            if rc == 0 and finished_at is None:
                finished_at = time.monotonic()
                say(f"replica group {g} finished; the others get {rg.grace:g}s to finish, "
                    "and no group is restarted from now on.")
            elif rc != 0:
                failures[g] = rc
                if finished_at is None:
                    say(f"replica group {g} gave up (exit status {rc}) after its restarts; "
                        "the other groups train on without it.")
        running = [g for g, p in procs.items() if p.poll() is None]
        if not running:
            break
        if finished_at is not None and time.monotonic() - finished_at > rg.grace:
            say(f"stopping replica group(s) {running}: the job finished.")
            _stop({g: procs[g] for g in running})
            break
        time.sleep(0.1)
    if finished_at is not None:
        return 0
    first = min(failures) if failures else 0
    say(f"every replica group failed; first: group {first} (exit status {failures[first]}).")
    return failures[first] if 0 < failures[first] < 256 else 1


def from_command(args: argparse.Namespace, spec: LaunchSpec) -> int:
    """``splitsync run --replica-groups R``: R groups on this machine under one Lighthouse
    (or, with ``--dry-run``, each group's command line)."""
    if not spec.single_node or args.rdzv_endpoint or args.node_rank is not None:
        raise LaunchError(
            "--replica-groups runs every group on this machine; on a cluster run one job per "
            "group (`splitsync run -n N` with REPLICA_GROUP_ID, NUM_REPLICA_GROUPS and "
            "TORCHFT_LIGHTHOUSE set) and one Lighthouse: see docs/fault-tolerance.md.")
    try:
        rg = ReplicaGroups(groups=args.replica_groups, nproc=spec.nproc_per_node,
                           max_restarts=spec.max_restarts,
                           heartbeat_timeout_ms=args.ft_heartbeat_timeout_ms,
                           min_replicas=args.ft_min_replicas, grace=args.ft_grace,
                           monitor_interval=spec.monitor_interval, module=spec.module)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if args.dry_run:
        for g in range(rg.groups):
            print(f"REPLICA_GROUP_ID={g} NUM_REPLICA_GROUPS={rg.groups} "
                  "TORCHFT_LIGHTHOUSE=http://127.0.0.1:PORT "
                  + " ".join(group_command(rg, spec.script, spec.script_args)), flush=True)
        return 0
    import importlib.util

    if importlib.util.find_spec("torchft") is None:  # a clear error before any group starts
        say("error: --replica-groups needs torchft: pip install 'splitsync[ft]'")
        return 2
    return run_replica_groups(rg, spec.script, spec.script_args)
