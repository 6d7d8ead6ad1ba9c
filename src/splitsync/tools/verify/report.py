"""The pass/fail table both verify modes print (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from splitsync.tools.verify.checks import Result

__all__ = ["print_table"]


def print_table(title: str, results: Sequence[Result], console: Console | None = None) -> bool:
    """Print one row per result; returns True when every check passed."""
    console = console or Console()
    table = Table(title=title, show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for r in results:
        mark = ("[yellow]not checkable[/]" if not r.checkable else
                "[green]PASS[/]" if r.ok else "[bold red]FAIL[/]")
        table.add_row(r.check, mark, r.detail)
    console.print(table)
    passed = bool(results) and all(r.ok for r in results)
    skipped = sum(not r.checkable for r in results)
    note = f" ({skipped} not checkable on this script)" if skipped else ""
    console.print(f"[green]all checks passed[/]{note}" if passed else "[bold red]verify FAILED[/]")
    return passed
