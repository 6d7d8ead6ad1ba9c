"""``splitsync audit RUN_DIR``: was every sample trained exactly once, across every restart?"""

from __future__ import annotations

import argparse
import json

DESCRIPTION = """\
Read the sample ledger a run wrote with splitsync.init(ledger=True, run_dir=RUN_DIR) across
every launch: elastic restarts, relaunches at other world sizes. Steps a crash rolled back
(taken after the last committed checkpoint, then redone) are set aside. For each epoch it
prints how many samples were trained once, more than once and never, and exits 1 on any
duplicate, any gap, an unreadable ledger file, or a resume that changed the seed, the
dataset's length or the batch size. The first bad sample is named with its step, rank and
launch."""

EPILOG = """\
examples:
  splitsync audit runs/exp1            the report; exit status 0 when exactly once
  splitsync audit runs/exp1 --json     the same as JSON, for scripts"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``RUN_DIR`` and ``--json``."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run_dir given to init()")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def main(args: argparse.Namespace) -> int:
    """0: every epoch exactly once (or in progress); 1: a problem; 2: no ledger."""
    from splitsync.tools.audit.audit import audit
    from splitsync.tools.audit.ft import audit_ft, is_ft
    from splitsync.tools.audit.report import render

    try:
        report = audit_ft(args.run_dir) if is_ft(args.run_dir) else audit(args.run_dir)
    except FileNotFoundError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        else:
            print(f"splitsync audit: {exc}")
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        render(report)
    return 0 if report.ok else 1
