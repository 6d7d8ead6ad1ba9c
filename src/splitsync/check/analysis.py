"""Read files together: a script with the local modules it imports and, for a helper named
alone, with the scripts beside it that import it; then run the rules on each with what its
project shows.
"""

from __future__ import annotations

import ast
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from splitsync.check.facts import Facts
from splitsync.check.index import TreeIndex, index_tree
from splitsync.check.model import Finding, Project, Rule
from splitsync.check.project import (
    Disk,
    file_project,
    local_imports,
    merge,
    unseen_imports,
    with_project,
)
from splitsync.check.reading import parse, read_source, run_rules

#: Siblings parsed while looking for a helper's importers: resolved path -> (text, index).
Parsed = dict[Path, tuple[str, TreeIndex]]

__all__ = ["Parsed", "collector_paused", "importers_beside", "importers_in", "load", "projects_of",
           "analyse"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while trees are built and read.

    Parsing allocates millions of AST nodes that live until the check ends; each allocation
    burst triggers a collection that scans all the nodes kept so far, which cost more than
    the parsing itself. The nodes hold no reference cycles (parents live in a dict), so
    nothing is left for the collector to find; it runs again as soon as the check ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def importers_beside(files: list[Path], disk: Disk,
                     parsed: Parsed) -> list[Path]:
    """Scripts next to the named files that import one of them (``train.py`` beside a named
    ``model.py``): a helper named alone is read with the scripts that use it. Each sibling
    parsed here is kept in ``parsed`` (by resolved path, with its text) for the analysis."""
    named = {disk.resolve(f) for f in files}
    return [found for folder in dict.fromkeys(disk.resolve(f).parent for f in files)
            for found in importers_in(folder, named, disk, parsed)]


def importers_in(folder: Path, named: set[Path], disk: Disk,
                 parsed: Parsed) -> list[Path]:
    """The scripts of ``folder`` that import one of the ``named`` files (resolved paths)."""
    stems = {f.stem for f in named if f.parent == folder}
    found: list[Path] = []
    for sibling in sorted(folder.glob("*.py")):
        if disk.resolve(sibling) in named:
            continue
        try:
            text = sibling.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if not any(stem in text for stem in stems):
            continue  # cheap test before parsing: it never names the helper
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError):
            continue
        index = index_tree(tree)  # kept with the text: reading the file later reuses both
        parsed[disk.resolve(sibling)] = (text, index)
        if local_imports(tree, disk.resolve(sibling), index.of(ast.Import, ast.ImportFrom),
                         disk) & named:
            found.append(sibling)
    return found


def load(path: Path, key: Path, disk: Disk,
         parsed: Parsed) -> tuple[Facts | Finding, set[Path], Project | None]:
    """One file's facts (or why it cannot be read), the local modules it imports, and its
    part of the project (with the imports of modules that could not be read)."""
    source = read_source(path)
    if isinstance(source, Finding):
        return source, set(), None
    text, index = parsed.pop(key, ("", None))
    # a sibling read as UTF-8 is parsed once; another encoding reads differently: parse again
    facts = parse(source, str(path), index if text == source else None)
    if isinstance(facts, Finding):
        return facts, set(), None
    imports = facts.of(ast.Import, ast.ImportFrom)
    unseen = unseen_imports(facts.tree, key, imports, disk, facts.of(ast.Try))
    return facts, local_imports(facts.tree, key, imports, disk), file_project(facts, unseen)


def projects_of(edges: dict[Path, set[Path]], parts: dict[Path, Project]) -> dict[Path, Project]:
    """Each file's :class:`Project`: the parts of the files it is read with, i.e. what it
    imports, the scripts that import it (and theirs), and everything those import."""
    importers: dict[Path, set[Path]] = {key: set() for key in parts}
    for key, targets in edges.items():
        for target in targets & parts.keys():
            importers[target].add(key)

    def reach(start: Path, links: dict[Path, set[Path]]) -> set[Path]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in links.get(todo.pop(), set()) & parts.keys():
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    closures = {key: reach(key, edges) for key in parts}
    merged: dict[frozenset[Path], Project] = {}  # files read together share one Project
    projects = {}
    for key in parts:
        together = frozenset().union(*(closures[a] for a in reach(key, importers)))
        if together not in merged:
            # an imported module's `__main__` block never runs in the program
            imported = {t for t in together if importers[t] & together}
            merged[together] = merge((parts[k] for k in sorted(together)),
                                     {parts[k].files[0] for k in imported})
        projects[key] = merged[together]
    return projects


def analyse(files: list[Path], rules: tuple[Rule, ...], context: list[Path] = (),  # type: ignore[assignment]
             disk: Disk | None = None,
             parsed: Parsed | None = None) -> dict[Path, list[Finding]]:
    """Findings per file for ``files`` and the local modules they import, each file read
    together with the modules it is connected to by imports. ``context`` files are read
    for what they show about the others; their own findings are not returned."""
    disk = Disk() if disk is None else disk
    parsed = {} if parsed is None else parsed
    hidden = {disk.resolve(f) for f in context}
    files = [*files, *context]
    shown = {disk.resolve(f): f for f in files}
    facts: dict[Path, Facts] = {}
    parts: dict[Path, Project] = {}
    failed: dict[Path, list[Finding]] = {}
    edges: dict[Path, set[Path]] = {}
    queue = list(shown)
    while queue:
        key = queue.pop()
        if key in facts or key in failed:
            continue
        loaded, edges[key], part = load(shown.get(key, key), key, disk, parsed)
        if isinstance(loaded, Finding) or part is None:
            failed[key] = [loaded]  # type: ignore[list-item]
            continue
        facts[key], parts[key] = loaded, part
        queue.extend(edges[key] - facts.keys())
    projects = projects_of(edges, parts)
    results = {k: v for k, v in failed.items() if k not in hidden}
    for key, f in facts.items():
        if key not in hidden:
            results[key] = run_rules(with_project(f, projects[key]), rules)
    return results
