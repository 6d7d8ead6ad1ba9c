"""``splitsync run``: launch a script on N processes per node with torchrun's elastic agent."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import replace
from typing import Any

from splitsync.launch import DEFAULT_RDZV_TIMEOUT, LaunchError, LaunchSpec

DESCRIPTION = """\
Launch SCRIPT on N processes per node. torchrun's elastic agent (torch.distributed.run) does
the work: c10d rendezvous, one worker per process, restarts. Every worker gets RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which splitsync.init() reads.

Everything after SCRIPT goes to the script untouched. A single-node run rendezvouses on
127.0.0.1 with a free port and listens on loopback only. Use --dry-run to see the
equivalent torchrun command."""

EPILOG = """\
examples:
  splitsync run -n 2 train.py --lr 3e-4          two processes on this machine
  splitsync run -n auto train.py                 one process per GPU (1 without GPUs)
  splitsync run --dry-run -n 4 train.py          print the torchrun command, run nothing
  # two machines, 8 GPUs each; the same command on both (node0 is reachable from node1):
  splitsync run --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 -n 8 train.py
  splitsync run --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29400 -n 8 train.py
  # elastic: 1 to 4 nodes, restart up to 3 times when a node fails or joins
  splitsync run --nnodes 1:4 --max-restarts 3 --rdzv-endpoint node0:29400 -n 8 train.py
  # inside `srun --ntasks-per-node=1` (SLURM) or a PyTorchJob pod, nodes, node rank and
  # endpoint come from the cluster manager:
  srun --ntasks-per-node=1 splitsync run -n 8 train.py"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``splitsync run``; SCRIPT ends them (later arguments belong to it)."""
    parser.add_argument("-n", "--nproc-per-node", dest="nproc", default=None, metavar="N|auto",
                        help="processes per node; 'auto' = visible GPUs, else 1 (default: 1, "
                        "or PET_NPROC_PER_NODE in a PyTorchJob pod)")
    parser.add_argument("--nnodes", default=None, metavar="N|MIN:MAX",
                        help="number of nodes, or a range for elastic runs (default: 1)")
    parser.add_argument("--node-rank", type=int, default=None, metavar="K",
                        help="this node's rank; node 0 hosts the rendezvous")
    parser.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                        help="address of node 0's rendezvous (c10d); needed with --nnodes > 1")
    parser.add_argument("--rdzv-id", default=None, metavar="ID",
                        help="job id shared by all nodes of one job (default: 'splitsync')")
    parser.add_argument("--rdzv-timeout", type=int, default=DEFAULT_RDZV_TIMEOUT,
                        metavar="SECONDS",
                        help="give up when the nodes have not met within this time "
                        f"(default: {DEFAULT_RDZV_TIMEOUT})")
    parser.add_argument("--rdzv-conf", default=None, metavar="K=V,...",
                        help="extra c10d rendezvous settings, e.g. last_call_timeout=5")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="R",
                        help="restart all workers up to R times after a failure (default: 0)")
    parser.add_argument("--monitor-interval", type=float, default=None, metavar="SECONDS",
                        help="how often the agent checks its workers (torchrun's default: 0.1)")
    parser.add_argument("-m", "--module", action="store_true",
                        help="SCRIPT is a module name, run like `python -m`")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the equivalent torchrun command and exit")
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...",
                        help="arguments for the script, passed untouched")


def _say(message: str) -> None:
    print(f"splitsync run: {message}", file=sys.stderr, flush=True)


def _accelerators() -> int:
    from splitsync.device import visible_device_count

    return max(visible_device_count(k) for k in ("cuda", "xpu", "mps"))


def spec_from_args(args: argparse.Namespace) -> LaunchSpec:
    """Validated launch settings from the parsed command line and the environment."""
    from splitsync.cluster import launch_defaults
    from splitsync.launch import build_spec

    cluster = launch_defaults(os.environ)
    nproc = str(args.nproc or cluster.nproc_per_node or "1")
    return build_spec(
        script=args.script, script_args=args.script_args, nproc=nproc, nnodes=args.nnodes,
        node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
        rdzv_timeout=args.rdzv_timeout, rdzv_conf=args.rdzv_conf,
        max_restarts=args.max_restarts, monitor_interval=args.monitor_interval,
        module=args.module, environ=os.environ,
        # Counting GPUs imports torch (seconds); only -n auto needs it, so bad input fails fast.
        accelerators=_accelerators() if nproc.strip().lower() == "auto" else 0,
        cluster=cluster,
    )


def main(args: argparse.Namespace) -> int:
    """Validate, print or launch; returns the exit status."""
    from splitsync.env import EnvError

    try:
        spec = spec_from_args(args)
        if args.dry_run:
            return _dry_run(spec)
        import torch.distributed.run  # noqa: F401  (slow; before waiting, so a node joins at once)

        from splitsync.rendezvous import reserve_endpoint

        with reserve_endpoint(spec) as ready:
            return _launch(ready)
    except (LaunchError, EnvError) as exc:
        _say(f"error: {exc}")
        return 2


def _dry_run(spec: LaunchSpec) -> int:
    from splitsync.group import free_port
    from splitsync.launch import torchrun_command

    if spec.rdzv_port == 0:
        spec = replace(spec, rdzv_port=free_port(spec.rdzv_host))
    print(torchrun_command(spec), flush=True)
    return 0


def _launch(spec: LaunchSpec) -> int:
    from torch.distributed.run import main as torchrun_main

    from splitsync.launch import torchrun_argv

    for key in [k for k in os.environ if k.startswith("PET_")]:
        # torchrun reads PET_<OPTION> for every option missing from its argv (a PyTorchJob
        # sets several); they are folded into the spec already, so the argv is the whole truth.
        del os.environ[key]
    for key, value in spec.env:
        os.environ[key] = value  # the agent passes its environment on to the workers
    if spec.max_restarts > 0 or spec.min_nodes != spec.max_nodes:
        # Restarted workers must not reuse the agent's store: they would read the dead
        # workers' gloo addresses and fail to connect (pytorch issues 135712, 167288).
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    for note in spec.notes:
        _say(note)
    if not spec.single_node:
        _say(f"node {spec.node_rank if spec.node_rank is not None else '?'} of "
             f"{spec.min_nodes if spec.min_nodes == spec.max_nodes else f'{spec.min_nodes}-{spec.max_nodes}'}"
             f" nodes, rendezvous at {spec.endpoint} (from {spec.source}), "
             f"timeout {spec.rdzv_timeout}s")
    try:
        torchrun_main(torchrun_argv(spec))
    except Exception as exc:  # torchrun's failures, reported in one paragraph
        return _report(exc, spec)
    return 0


def _report(exc: Exception, spec: LaunchSpec) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    if isinstance(exc, ChildFailedError):
        return _report_children(exc.failures)
    if isinstance(exc, SignalException):
        _say(f"stopped by {exc.sigval.name}; workers were terminated.")
        return 128 + int(exc.sigval)
    if isinstance(exc, RendezvousError):
        _say(_explain_rendezvous(exc, spec))
        return 1
    raise exc


def _report_children(failures: dict[int, Any]) -> int:
    first = min(failures, key=lambda r: failures[r].timestamp)
    for rank in sorted(failures):
        f = failures[rank]
        how = (f"was killed by signal {signal.Signals(-f.exitcode).name}" if f.exitcode < 0
               else f"exited with code {f.exitcode}")
        detail = f": {f.message.splitlines()[0]}" if isinstance(f.message, str) and f.message \
            and not f.message.startswith("To enable traceback") else ""
        _say(f"rank {rank} (local rank {f.local_rank}, pid {f.pid}) {how}{detail}")
    code = failures[first].exitcode
    ranks = ", ".join(str(r) for r in sorted(failures))
    _say(f"failed: rank(s) {ranks}; first failure: rank {first}. Its output is above.")
    if code < 0:
        return 128 + (-code)
    return code if 0 < code < 256 else 1


def _explain_rendezvous(exc: BaseException, spec: LaunchSpec) -> str:
    from torch.distributed.elastic.rendezvous import (
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    host, port = spec.rdzv_host, spec.rdzv_port
    if isinstance(exc, RendezvousConnectionError):
        return (f"could not reach the rendezvous at host {host} port {port} within "
                f"{min(spec.rdzv_timeout, 60)}s. Check that node 0 runs `splitsync run` with the "
                "same --rdzv-endpoint, that the host name resolves and that the port is open "
                "(firewall); `splitsync env` on each node shows its addresses.")
    if isinstance(exc, RendezvousTimeoutError):
        return (f"the nodes did not all meet at {spec.endpoint} within --rdzv-timeout "
                f"{spec.rdzv_timeout}s (need {spec.min_nodes} node(s)). Start the same command "
                "on every node, with the same --rdzv-endpoint and --rdzv-id.")
    return f"rendezvous at {spec.endpoint} failed: {exc}"
