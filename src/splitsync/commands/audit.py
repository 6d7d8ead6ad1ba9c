"""``splitsync audit RUN_DIR``: was every sample trained exactly once, across every restart?"""

from __future__ import annotations

import argparse
import json
from typing import Any

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


def render(report: Any) -> None:
    """The report as rich tables on the terminal (plain text when piped)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    # piped output keeps the tables whole instead of wrapping them at 80 columns
    con = Console(highlight=False, soft_wrap=True,
                  width=None if sys.stdout.isatty() else 110)
    con.print(f"[bold]splitsync audit[/bold] {report.run_dir}")
    lt = Table(title="launches", title_justify="left")
    for col in ("launch", "world size", "restart", "seed", "resumed from", "last step",
                "closed"):
        lt.add_column(col, justify="right")
    for la in report.launches:
        start = la["resumed_from_step"]
        lt.add_row(str(la["launch"]), str(la["world_size"]), str(la["restart_count"]),
                   str(la["seed"]), "-" if start is None else f"step {start}",
                   str(la["last_step"]),
                   "yes" if la["clean"] else "on an error" if la["closed"] else "no")
    con.print(lt)
    for s in report.superseded:
        con.print(f"superseded: launch {s['launch']} steps {s['first_step']}-{s['last_step']} "
                  "(rolled back by a later resume)")
    et = Table(title="epochs", title_justify="left")
    for col in ("loader", "epoch", "samples", "once", "more than once", "never", "padded",
                "status"):
        et.add_column(col, justify="right" if col != "status" else "left")
    for c in report.epochs:
        style = {"exactly once": "green", "in progress": "yellow",
                 "dropped by drop_last": "yellow"}.get(
            c.status, "yellow" if c.status.startswith(("ended early", "up to")) else "bold red")
        et.add_row(str(c.loader), str(c.epoch), str(c.samples), str(c.once), str(c.more),
                   str(c.never), str(c.padded), f"[{style}]{c.status}[/{style}]")
    con.print(et)
    for ev in getattr(report, "evaluation", ()):
        con.print(f"evaluation: loader {ev['loader']} ({ev['kind']}), {ev['passes']} pass(es), "
                  f"not counted as training ({ev['how']})")
    for note in report.extra.get("notes", []):
        con.print(f"note: {note}")
    for f in report.findings:
        con.print(("[bold red]problem[/bold red]: " if f.error else "note: ") + f.message)
    bad = report.first_bad
    if bad is not None:
        where = (f" at step {bad['step']}, rank {bad['rank']}, launch {bad['launch']}"
                 if "step" in bad else "")
        first = bad.get("first_trained")
        also = (f" (first at step {first['step']}, rank {first['rank']}, launch "
                f"{first['launch']})" if first else "")
        con.print(f"[bold red]first bad sample[/bold red]: loader {bad['loader']} epoch "
                  f"{bad['epoch']} {bad['name']}: {bad['problem']}{where}{also}")
    _goodput(report.run_dir, con)
    con.print(f"ledger: {report.bytes} bytes for {report.samples_recorded} samples "
              f"({report.bytes_per_sample:.2f} bytes a sample)")
    con.print(verdict(report))


def verdict(report: Any) -> str:
    """The last line: FAILED, a bare OK only when every epoch is exactly once, else OK with
    what the epochs that are not say."""
    if not report.ok:
        return "[bold red]FAILED[/bold red]"
    if not report.epochs:
        return "[bold green]OK[/bold green]: nothing was trained (no step recorded)"
    others = sorted({c.status.split(":")[0] for c in report.epochs
                     if c.status != "exactly once"})
    if not others:
        return "[bold green]OK[/bold green]: every epoch exactly once"
    return ("[bold green]OK[/bold green]: no sample trained more than its epoch allows or "
            f"lost; some epochs are {', '.join(others)} (see the table)")


def _goodput(run_dir: str, con: Any) -> None:
    """The goodput lines, when the run kept its clock (splitsync goodput RUN_DIR)."""
    from splitsync.tools.goodput import goodput, render

    try:
        report = goodput(run_dir)
    except FileNotFoundError:
        return
    render(report, lambda line: con.print(line, markup=False))
