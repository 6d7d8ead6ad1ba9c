"""``splitsync run``: launch a script on N processes per node with torchrun's elastic agent."""

from __future__ import annotations

import argparse
import os

from splitsync.launch.spec import (
    DEFAULT_RDZV_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    LaunchError,
    LaunchSpec,
)

DESCRIPTION = """\
Launch SCRIPT on N processes per node. torchrun's elastic agent (torch.distributed.run) does
the work: c10d rendezvous, one worker per process, restarts. Every worker gets RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which splitsync.init() reads.

Everything after SCRIPT goes to the script untouched. A single-node run rendezvouses on
127.0.0.1 with a free port and listens on loopback only. Use --dry-run to see the
equivalent torchrun command.

On SIGTERM or SIGUSR1 (to this command or to any worker), workers whose script called
run.resume stop after one agreed step and save it (init(preempt_signals=...)); this command
then exits with code 75, without restarting them: launch it again to continue."""

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
  srun --ntasks-per-node=1 splitsync run -n 8 train.py
  # fault tolerant (init(fault_tolerance="torchft")): 2 replica groups of 2 processes; a
  # group that fails is restarted (up to 3 times) while the other trains on
  splitsync run --replica-groups 2 -n 2 --max-restarts 3 train.py"""


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
    parser.add_argument("--shutdown-timeout", type=int, default=DEFAULT_SHUTDOWN_TIMEOUT,
                        metavar="SECONDS",
                        help="on SIGTERM or SIGUSR1, wait this long for the workers to save "
                        "and exit before killing them (default: "
                        f"{DEFAULT_SHUTDOWN_TIMEOUT}; keep it above the script's "
                        "init(preempt_grace=...))")
    ft = parser.add_argument_group("fault tolerance (init(fault_tolerance='torchft'))")
    ft.add_argument("--replica-groups", type=int, default=None, metavar="R",
                    help="run R replica groups of N processes under torchft, with a "
                    "Lighthouse on loopback; --max-restarts applies to each group")
    ft.add_argument("--ft-heartbeat-timeout-ms", type=int, default=1000, metavar="MS",
                    help="the Lighthouse declares a silent group dead after this (default: "
                    "1000)")
    ft.add_argument("--ft-min-replicas", type=int, default=1, metavar="K",
                    help="groups a quorum needs (default: 1)")
    ft.add_argument("--ft-grace", type=float, default=10.0, metavar="SECONDS",
                    help="once a group has finished, the others get this long to finish "
                    "(the groups of the last quorum end together) before they are stopped "
                    "(default: 10)")
    parser.add_argument("-m", "--module", action="store_true",
                        help="SCRIPT is a module name, run like `python -m`")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the equivalent torchrun command and exit")
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="...",
                        help="arguments for the script, passed untouched")


def spec_from_args(args: argparse.Namespace) -> LaunchSpec:
    """Validated launch settings from the parsed command line and the environment."""
    from splitsync.launch.agent import accelerators
    from splitsync.launch.cluster import launch_defaults
    from splitsync.launch.spec import build_spec

    cluster = launch_defaults(os.environ)
    nproc = str(args.nproc or cluster.nproc_per_node or "1")
    return build_spec(
        script=args.script, script_args=args.script_args, nproc=nproc, nnodes=args.nnodes,
        node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
        rdzv_timeout=args.rdzv_timeout, rdzv_conf=args.rdzv_conf,
        max_restarts=args.max_restarts, monitor_interval=args.monitor_interval,
        shutdown_timeout=args.shutdown_timeout, module=args.module, environ=os.environ,
        # Counting GPUs imports torch (seconds); only -n auto needs it, so bad input fails fast.
        accelerators=accelerators() if nproc.strip().lower() == "auto" else 0,
        cluster=cluster,
    )


def main(args: argparse.Namespace) -> int:
    """Validate, print or launch; returns the exit status."""
    from splitsync.distributed.env import EnvError
    from splitsync.launch.agent import dry_run, run_agent, say

    try:
        spec = spec_from_args(args)
        if args.replica_groups is not None:
            from splitsync.launch.replica_groups import from_command

            return from_command(args, spec)
        if args.dry_run:
            return dry_run(spec)
        import torch.distributed.run  # noqa: F401  (slow; before waiting, so a node joins at once)

        from splitsync.launch.rendezvous import reserve_endpoint

        with reserve_endpoint(spec) as ready:
            return run_agent(ready)
    except (LaunchError, EnvError) as exc:
        say(f"error: {exc}")
        return 2
