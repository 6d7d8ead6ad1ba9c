"""Text tables the commands print (``splitsync plan``, ``splitsync bench``)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["markdown_table"]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; numbers are printed as given (format them first)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])
