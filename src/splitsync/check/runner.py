"""Run the rules over a source string, a file or a tree of files.

Suppression comments (``# splitsync: ignore[SS501]``) are read by
:mod:`splitsync.check.reading`; files are read together with their local modules by
:mod:`splitsync.check.analysis`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from splitsync.check.analysis import Parsed, analyse, collector_paused, importers_beside
from splitsync.check.model import Finding, Rule
from splitsync.check.pool import analyse_in_pool, portable
from splitsync.check.project import Disk, with_project
from splitsync.check.reading import Suppressions, parse, parse_suppressions, run_rules
from splitsync.check.registry import all_rules

__all__ = ["check_source", "check_file", "check_paths", "iter_python_files", "workers_for",
           "Suppressions", "parse_suppressions"]

_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "build", "dist"})
#: Named files per extra process: starting a worker costs about as much as reading a dozen.
_FILES_PER_WORKER = 12


def check_source(source: str, path: str = "<string>",
                 rules: Iterable[Rule] | None = None) -> list[Finding]:
    """All findings for one script's text (read alone, imports not followed), sorted by line."""
    rules = all_rules() if rules is None else tuple(rules)
    facts = parse(source, path)
    if isinstance(facts, Finding):
        return [facts]
    return run_rules(with_project(facts), rules)


def check_file(path: str | Path, rules: Iterable[Rule] | None = None) -> list[Finding]:
    """Findings for one file, read together with the local modules it imports."""
    rules = all_rules() if rules is None else tuple(rules)
    path = Path(path)
    disk: Disk = Disk()
    parsed: Parsed = {}
    with collector_paused():
        context = importers_beside([path], disk, parsed)
        return analyse([path], rules, context, disk, parsed).get(disk.resolve(path), [])


def iter_python_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Each ``.py`` file named, or found under a named directory (hidden and build dirs skipped)."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for found in sorted(path.rglob("*.py")):
                rel = found.relative_to(path).parts[:-1]
                if not any(p.startswith(".") or p in _SKIP_DIRS for p in rel):
                    yield found
        elif path.is_file():
            yield path
        else:
            raise FileNotFoundError(f"{raw}: no such file or directory (give scripts or folders "
                                    "of scripts to check)")


def workers_for(files: int, jobs: int | None = None) -> int:
    """How many processes read ``files`` files: ``jobs`` when given, else one per core this
    process may use, once there are enough files to pay for starting them (a dozen each; a
    few files are read in this process). Measured on two cores with 150 corpus files: two
    processes 3.3-3.9 s, one 3.8-5.4 s (median wall of three, alternating)."""
    if jobs is not None:
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ValueError(f"jobs={jobs!r}: give a number of processes >= 1 (1 reads every "
                             "file in this process), or None to use one per core")
        return jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, files // _FILES_PER_WORKER))


def check_paths(paths: Iterable[str | Path], rules: Iterable[Rule] | None = None,
                jobs: int | None = None) -> tuple[list[Finding], int]:
    """Findings for every file under ``paths`` and the local modules they import, and how
    many files were checked. ``jobs``: processes reading the files (None: one per core for
    many files, this process alone for a few); the findings do not depend on it."""
    rules = all_rules() if rules is None else tuple(rules)
    files = list(dict.fromkeys(iter_python_files(paths)))
    workers = workers_for(len(files), jobs)
    disk: Disk = Disk()
    with collector_paused():
        if workers > 1 and portable(rules):
            results = analyse_in_pool(files, rules, workers, disk)
        else:
            parsed: Parsed = {}
            results = analyse(files, rules, importers_beside(files, disk, parsed), disk, parsed)
    named = {disk.resolve(f) for f in files}
    extra = sorted(k for k in results if k not in named)  # imported modules outside `paths`
    order = [disk.resolve(f) for f in files] + extra
    findings = [f for key in dict.fromkeys(order) for f in results.get(key, [])]
    return findings, len(order)
