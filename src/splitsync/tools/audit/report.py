"""``splitsync audit``'s report on the terminal: launches, epochs, problems, goodput."""

from __future__ import annotations

from typing import Any

__all__ = ["render", "verdict"]


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
    from splitsync.tools.goodput.report import goodput, render

    try:
        report = goodput(run_dir)
    except FileNotFoundError:
        return
    render(report, lambda line: con.print(line, markup=False))
