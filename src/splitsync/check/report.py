"""Reporters: human text (rich, colour only on a terminal) and JSON for machines."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TextIO

from splitsync.check.model import SEVERITIES, Finding, Rule
from splitsync.check.registry import META_CODES, META_HELP

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["summary", "not_read", "render_text", "render_json", "render_rules", "rules_json"]

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
#: The runner's code for an imported module of the project it could not read: listed once
#: per run after the findings, not as a finding of its own.
NOT_READ = "SS003"


def not_read(findings: Iterable[Finding]) -> dict[str, list[str]]:
    """Each module the run could not read, with where it is imported (``path:line``), sorted
    by module, then by path and line: the same list however many processes read the files."""
    out: dict[str, set[tuple[str, int]]] = {}
    for f in findings:
        if f.code == NOT_READ:
            module = f.message.split("`", 2)[1]
            out.setdefault(module, set()).add((f.path, f.line))
    return {module: [f"{path}:{line}" for path, line in sorted(out[module])]
            for module in sorted(out)}


def summary(findings: Iterable[Finding]) -> dict[str, int]:
    """Counts per severity, every severity present."""
    counts = Counter(f.severity for f in findings)
    return {s: counts.get(s, 0) for s in SEVERITIES}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 or word == "info" else "s")


def _console(stream: TextIO | None) -> Console:
    from rich.console import Console

    console = Console(file=stream, highlight=False, soft_wrap=True)
    if not console.is_terminal:  # pipes and CI logs: don't squeeze tables into 80 columns
        console.width = max(console.width, 120)
    return console


def render_text(findings: Sequence[Finding], files: int, stream: TextIO | None = None) -> None:
    """``path:line:col: CODE severity name`` then the message and the fix, and a summary."""
    from rich.text import Text

    console = _console(stream)
    unread = not_read(findings)
    findings = [f for f in findings if f.code != NOT_READ]
    for f in findings:
        head = Text()
        head.append(f"{f.path}:{f.line}:{f.column}: ", style="bold")
        head.append(f"{f.code} ", style="bold")
        head.append(f.severity, style=_STYLE[f.severity])
        head.append(f" [{f.name}]", style="dim")
        console.print(head)
        console.print(Text(f"  {f.message}"))
        console.print(Text(f"  fix: {f.fix}", style="green"))
    counts = summary(findings)
    checked = _plural(files, "file") + " checked"
    if not findings:
        console.print(Text(f"No problems found ({checked}).", style="bold green"))
    else:
        flagged = len({f.path for f in findings})
        parts = ", ".join(_plural(n, s) for s, n in counts.items() if n)
        console.print(Text(f"Found {parts} in {_plural(flagged, 'file')} ({checked}).",
                           style="bold red" if counts["error"] else "bold yellow"))
    if unread:
        listed = "; ".join(f"{m} (imported at {', '.join(w)})" for m, w in unread.items())
        console.print(Text(f"Not read: {listed}. Findings that depend on what these modules do "
                           "were not claimed; pass them too (or the folder that holds them).",
                           style="dim"))


def render_json(findings: Sequence[Finding], files: int) -> str:
    """A JSON document: version, files checked, counts per severity, the findings, and the
    imported modules that could not be read (``not_read``: module -> where imported)."""
    shown = [f for f in findings if f.code != NOT_READ]
    return json.dumps({"version": 1, "files_checked": files, "summary": summary(shown),
                       "findings": [f.as_dict() for f in shown],
                       "not_read": not_read(findings)}, indent=2)


def rules_json(rules: Sequence[Rule]) -> str:
    """The rule list as JSON."""
    return json.dumps([{"code": r.code, "name": r.name, "severity": r.severity,
                        "summary": r.summary, "explain": r.explain} for r in rules], indent=2)


def render_rules(rules: Sequence[Rule], stream: TextIO | None = None) -> None:
    """A table of the rules for ``--list-rules``."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False)
    for column in ("code", "severity", "name", "what it finds"):
        table.add_column(column, no_wrap=column != "what it finds")
    for r in rules:
        table.add_row(r.code, f"[{_STYLE[r.severity]}]{r.severity}[/]", r.name,
                      r.summary.replace("[", "\\["))
    for code, name in META_CODES.items():
        severity, what = META_HELP[code]
        table.add_row(code, f"[{_STYLE[severity]}]{severity}[/]", name, what.replace("[", "\\["))
    _console(stream).print(table)
