"""``splitsync goodput RUN_DIR``: where a run's wall time went, across restarts."""

from __future__ import annotations

import argparse
import json

DESCRIPTION = """\
Read the clock every run made with splitsync.init(run_dir=RUN_DIR) keeps (RUN_DIR/goodput)
and split the job's wall time into: steps that count, steps discarded (a fault-tolerant
peer failed mid-step) or rolled back (redone after a restart from an older checkpoint),
torchft's quorums and live recoveries, stalls in run.save, start-up after a (re)start, time
a process was down, and the rest. The parts add up to the wall time (per replica group
under fault tolerance); goodput is the share that counted."""

EPILOG = """\
examples:
  splitsync goodput runs/exp1          the table
  splitsync goodput runs/exp1 --json   the same for scripts"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run_dir given to init()")
    parser.add_argument("--json", action="store_true", help="print JSON")


def main(args: argparse.Namespace) -> int:
    """0 with a report, 2 when RUN_DIR has no goodput records."""
    from splitsync.tools.goodput.report import goodput, render

    try:
        report = goodput(args.run_dir)
    except FileNotFoundError as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"splitsync goodput: {exc}")
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        render(report)
    return 0
