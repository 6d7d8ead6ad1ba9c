"""``splitsync plan --failures``: goodput of restart-based and fault-tolerant runs under
failures, and the best checkpoint interval (the options, and the table)."""

from __future__ import annotations

import argparse
import json

__all__ = ["add_failure_arguments", "failures_main"]


def add_failure_arguments(parser: argparse.ArgumentParser) -> None:
    f = parser.add_argument_group(
        "failures (--failures: goodput and the best checkpoint interval, restart-based and "
        "fault tolerant)")
    f.add_argument("--failures", action="store_true",
                   help="predict goodput under failures instead of step time")
    f.add_argument("--nodes", type=int, default=1, help="nodes (machines) in the job")
    f.add_argument("--mtbf-hours", type=float, default=None, metavar="H",
                   help="mean time between failures of one node, hours")
    f.add_argument("--mtbf-s", type=float, default=None, metavar="S",
                   help="the same in seconds (instead of --mtbf-hours)")
    f.add_argument("--save-s", type=float, default=None, metavar="S",
                   help="seconds a checkpoint stalls training")
    f.add_argument("--restart-s", type=float, default=None, metavar="S",
                   help="seconds from a failure until the restarted job trains again")
    f.add_argument("--step-s", type=float, default=1.0, metavar="S", help="seconds per step")
    f.add_argument("--replica-groups", type=int, default=2, metavar="G",
                   help="replica groups of the fault-tolerant run (default: 2)")
    f.add_argument("--heartbeat-s", type=float, default=1.0, metavar="S",
                   help="the Lighthouse's heartbeat timeout (default: 1)")
    f.add_argument("--heal-s", type=float, default=0.2, metavar="S",
                   help="one live recovery (default: 0.2)")
    f.add_argument("--rejoin-s", type=float, default=None, metavar="S",
                   help="a failed group's restart and recovery (default: --restart-s)")
    f.add_argument("--quorum-s", type=float, default=0.0, metavar="S",
                   help="a quorum's cost per step (default: 0)")
    f.add_argument("--startup-s", type=float, default=0.0, metavar="S",
                   help="the first launch's start, paid once (with --work-s)")
    f.add_argument("--work-s", type=float, default=None, metavar="S",
                   help="the job's useful compute, seconds (default: long)")
    f.add_argument("--interval-s", type=float, default=None, metavar="S",
                   help="also predict at this checkpoint interval (training seconds)")
    f.add_argument("--failure-pattern", default="poisson", choices=("poisson", "periodic"),
                   help="failures at random (default) or at a fixed period")


def failures_main(args: argparse.Namespace) -> int:
    from splitsync.tools.plan.failures import FailureInputs, plan_failures

    if (args.mtbf_hours is None) == (args.mtbf_s is None):
        raise SystemExit("splitsync plan --failures: give the failure rate as --mtbf-hours H "
                         "or --mtbf-s S (per node).")
    if args.save_s is None or args.restart_s is None:
        raise SystemExit("splitsync plan --failures: give --save-s (a checkpoint's stall) and "
                         "--restart-s (a failure to training again).")
    mtbf = args.mtbf_s if args.mtbf_s is not None else args.mtbf_hours * 3600
    try:
        inputs = FailureInputs(
            nodes=args.nodes, mtbf=mtbf, save=args.save_s, restart=args.restart_s,
            step=args.step_s, groups=args.replica_groups, heartbeat=args.heartbeat_s,
            heal=args.heal_s, rejoin=args.rejoin_s, quorum=args.quorum_s,
            startup=args.startup_s, work=args.work_s, pattern=args.failure_pattern)
        plans = plan_failures(inputs, args.interval_s)
    except ValueError as exc:
        raise SystemExit(f"splitsync plan --failures: {exc}") from None
    if args.json:
        print(json.dumps({"inputs": inputs.__dict__, "plans": [p.as_dict() for p in plans]},
                         indent=2))
        return 0
    from splitsync.bench.harness import markdown_table

    print(f"{inputs.nodes} node(s), a failure every {mtbf / inputs.nodes:,.0f}s of the job "
          f"({inputs.pattern}); checkpoint stall {inputs.save:g}s, restart {inputs.restart:g}s; "
          f"fault tolerant: {inputs.groups} replica groups, heartbeat {inputs.heartbeat:g}s")
    print()
    rows = [[p.mode, "never" if p.interval == float("inf") else f"{p.interval:,.1f}",
             f"{100 * p.goodput:.1f}%", f"{100 * p.job_goodput:.1f}%", f"{p.per_failure:,.1f}",
             p.note] for p in plans]
    print(markdown_table(["run", "checkpoint every (s)", "goodput", "job goodput",
                          "s lost per failure", "note"], rows))
    return 0
