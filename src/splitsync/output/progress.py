"""Progress over an iterable: a rich bar on a terminal, plain lines in logs, silence elsewhere.

Only the main rank shows anything; every other rank gets its iterable back untouched, so
the hot loop pays nothing there. On the main rank the per-item cost is one clock read;
the display is updated at most ``UPDATE_INTERVAL`` times a second.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

__all__ = ["progress", "default_every", "UPDATE_INTERVAL", "preload"]

T = TypeVar("T")
UPDATE_INTERVAL = 0.1  # seconds between updates of the rich bar


def _length(iterable: Iterable[object]) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None


def default_every(total: int | None) -> int:
    """Plain-line interval: a line at each quarter of a pass, or every 100 items if unsized."""
    if total is None or total <= 0:
        return 100
    return max(1, -(-total // 4))


def preload() -> None:
    """Import rich now, as ``init`` does on the main rank before it seeds: rich draws from
    Python's ``random`` at import, and imported by the first ``run.progress`` (after a
    resume, at another moment than in the run never stopped) it would shift the script's
    own draws."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("rich") is None:
        return
    for name in ("rich.console", "rich.progress", "rich.text"):
        importlib.import_module(name)


def _is_terminal(stream: TextIO) -> bool:
    from rich.console import Console

    console = Console(file=stream)
    return console.is_terminal and not console.is_dumb_terminal


def progress(iterable: Iterable[T], *, show: bool, total: int | None = None, desc: str = "",
             every: int | None = None, stream: TextIO | None = None) -> Iterable[T]:
    """Yield the items of ``iterable`` while reporting progress on ``stream``.

    ``show=False`` returns ``iterable`` itself. On a terminal a rich progress bar is drawn;
    otherwise (a log file, a pipe) a plain line is printed every ``every`` items and after
    the last one.
    """
    if every is not None and (not isinstance(every, int) or every < 1):
        raise ValueError(f"every={every!r}: give a positive number of items between lines.")
    if not show:
        return iterable
    out = sys.stdout if stream is None else stream
    size = _length(iterable) if total is None else total
    if _is_terminal(out):
        return _rich_bar(iterable, size, desc, out)
    return _plain_lines(iterable, size, desc, every or default_every(size), out)


def _rate(done: int, elapsed: float) -> str:
    return f"{done / elapsed:.1f} it/s" if elapsed > 0 else "- it/s"


def _plain_lines(iterable: Iterable[T], total: int | None, desc: str, every: int,
                 out: TextIO) -> Iterator[T]:
    prefix = f"{desc}: " if desc else ""
    start = time.perf_counter()
    done = 0
    next_line = every
    for item in iterable:
        yield item
        done += 1
        if done >= next_line:
            next_line += every
            if done != total:  # the final line is printed once, below
                _line(out, prefix, done, total, time.perf_counter() - start)
    _line(out, prefix, done, total, time.perf_counter() - start)


def _line(out: TextIO, prefix: str, done: int, total: int | None, elapsed: float) -> None:
    if total:
        where = f"{done}/{total} ({100 * done // total}%)"
    else:
        where = f"{done}"
    out.write(f"{prefix}{where} {elapsed:.1f}s {_rate(done, elapsed)}\n")
    out.flush()


def _rich_bar(iterable: Iterable[T], total: int | None, desc: str, out: TextIO) -> Iterator[T]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class SpeedColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("- it/s" if speed is None else f"{speed:.1f} it/s")

    bar = Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(),
        MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(), SpeedColumn(),
        console=Console(file=out), refresh_per_second=10,
    )
    done = 0
    with bar:
        task = bar.add_task(desc, total=total)
        next_update = time.perf_counter() + UPDATE_INTERVAL
        for item in iterable:
            yield item
            done += 1
            now = time.perf_counter()
            if now >= next_update:  # keep rich's lock and bookkeeping off most items
                next_update = now + UPDATE_INTERVAL
                bar.update(task, completed=done)
        bar.update(task, completed=done)
