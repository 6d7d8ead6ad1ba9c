"""Run the rules over a source string, a file or a tree of files; apply suppression comments.

A finding is silenced by a comment on its line (or any line of the flagged expression):
``# splitsync: ignore[SS501]``, ``# splitsync: ignore[SS501, SS204]`` or ``# splitsync: ignore``
(every code). ``# splitsync: ignore-file[SS501]`` anywhere silences a code in the whole file.
"""

from __future__ import annotations

import ast
import gc
import io
import re
import tokenize
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from splitsync.tools.lint.facts import Facts, build_facts
from splitsync.tools.lint.flow import with_rank0_functions
from splitsync.tools.lint.model import SEVERITIES, Finding, Project, Rule
from splitsync.tools.lint.project import Disk, file_project, local_imports, merge, with_project
from splitsync.tools.lint.registry import META_CODES, all_rules

__all__ = ["check_source", "check_file", "check_paths", "iter_python_files", "Suppressions"]

_COMMENT = re.compile(r"#\s*splitsync:\s*ignore(-file)?\b(?:\[([^\]]*)\])?", re.IGNORECASE)
_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "build", "dist"})
ALL = "*"


@dataclass(frozen=True)
class Suppressions:
    """Codes silenced per line, codes silenced for the whole file, and malformed comments."""

    lines: dict[int, frozenset[str]]
    whole_file: frozenset[str]
    unknown: tuple[tuple[int, int, str], ...]

    def silences(self, code: str, first: int, last: int) -> bool:
        """Is ``code`` silenced on any line from ``first`` to ``last``?"""
        if code in self.whole_file or ALL in self.whole_file:
            return True
        return any(code in c or ALL in c for n in range(first, last + 1)
                   if (c := self.lines.get(n)))


def _comments(source: str) -> Iterator[tuple[int, int, str]]:
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.start[1] + 1, tok.string
    except (tokenize.TokenError, SyntaxError):
        return


def parse_suppressions(source: str) -> Suppressions:
    """Read ``# splitsync: ignore[...]`` comments from ``source``."""
    if "splitsync" not in source:
        return Suppressions({}, frozenset(), ())  # no comment can name us: skip tokenizing
    known = {r.code for r in all_rules()} | set(META_CODES)
    lines: dict[int, frozenset[str]] = {}
    whole: set[str] = set()
    unknown: list[tuple[int, int, str]] = []
    for line, col, text in _comments(source):
        match = _COMMENT.search(text)
        if match is None:
            continue
        codes = {c.strip().upper() for c in (match.group(2) or "").split(",") if c.strip()}
        for code in sorted(codes - known):
            unknown.append((line, col, code))
        codes = (codes & known) if match.group(2) is not None else {ALL}
        if match.group(1):
            whole |= codes
        else:
            lines[line] = lines.get(line, frozenset()) | frozenset(codes)
    return Suppressions(lines, frozenset(whole), tuple(unknown))


def _span(node: ast.AST) -> tuple[int, int, int]:
    line = getattr(node, "lineno", 1)
    col = getattr(node, "col_offset", 0) + 1
    end = getattr(node, "end_lineno", line) if isinstance(node, ast.expr) else line
    return line, col, end or line


def _parse(source: str, path: str, tree: ast.Module | None = None) -> Facts | Finding:
    """The file's facts, or the SS000 finding saying why it cannot be read (``tree``: the
    source already parsed)."""
    if tree is not None:
        return build_facts(tree, path, source)
    try:
        tree = ast.parse(source, filename=path)
    except RecursionError:
        return Finding("SS000", META_CODES["SS000"], "error",
                       f"cannot parse {path}: it is nested too deeply for Python's parser.",
                       "split the deepest expression into smaller statements.",
                       path, 1, 1, 1)
    except (SyntaxError, ValueError) as err:
        line = getattr(err, "lineno", None) or 1
        return Finding("SS000", META_CODES["SS000"], "error",
                       f"cannot parse {path}: {getattr(err, 'msg', err)}; no rule was checked.",
                       "fix the syntax error (Python would refuse to run the script too).",
                       path, line, getattr(err, "offset", None) or 1, line)
    return build_facts(tree, path, source)


def _weaker(hit: str | None, rule: str) -> str:
    """A hit may lower its rule's severity, never raise it past the rule's (gated) level."""
    if hit is None:
        return rule
    return max(hit, rule, key=SEVERITIES.index)


def _run_rules(facts: Facts, rules: tuple[Rule, ...]) -> list[Finding]:
    facts = with_rank0_functions(facts)  # after the project is known: helpers run per rank too
    path = facts.path
    quiet = parse_suppressions(facts.source)
    found: dict[tuple[str, int, int], Finding] = {}
    for rule in rules:
        try:
            hits = list(rule.check(facts))
        except Exception as err:  # one broken rule must not hide the others' findings
            found[("SS002", 1, 1)] = Finding(
                "SS002", META_CODES["SS002"], "warning",
                f"rule {rule.code} ({rule.name}) failed on {path}: {type(err).__name__}: {err}; "
                "the other rules still ran.",
                f"report this file to splitsync; silence with `--ignore {rule.code}`.",
                path, 1, 1, 1)
            continue
        for hit in hits:
            line, col, end = _span(hit.node)
            if quiet.silences(rule.code, line, end):
                continue
            found.setdefault((rule.code, line, col), Finding(
                rule.code, rule.name, _weaker(hit.severity, rule.severity), hit.message, hit.fix, path,
                line, col, end))
    if "SS001" not in quiet.whole_file:
        for line, col, code in quiet.unknown:
            found[("SS001", line, col)] = Finding(
                "SS001", META_CODES["SS001"], "warning",
                f"`# splitsync: ignore[{code}]` names no rule, so it silences nothing.",
                "use a code from `splitsync check --list-rules`.", path, line, col, line)
    return sorted(found.values(), key=lambda f: (f.line, f.column, f.code))


def check_source(source: str, path: str = "<string>",
                 rules: Iterable[Rule] | None = None) -> list[Finding]:
    """All findings for one script's text (read alone, imports not followed), sorted by line."""
    rules = all_rules() if rules is None else tuple(rules)
    facts = _parse(source, path)
    if isinstance(facts, Finding):
        return [facts]
    return _run_rules(with_project(facts), rules)


def _read(path: Path) -> str | Finding:
    try:
        with tokenize.open(path) as fh:
            return fh.read()
    except (SyntaxError, UnicodeDecodeError) as err:
        return Finding("SS000", META_CODES["SS000"], "error",
                       f"cannot read {path} as Python source: {err}.",
                       "save it as UTF-8 (or fix its coding cookie).", str(path), 1, 1, 1)


@contextmanager
def _collector_paused() -> Iterator[None]:
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


def _importers_beside(files: list[Path], disk: Disk,
                      parsed: dict[Path, tuple[str, ast.Module]]) -> list[Path]:
    """Scripts next to the named files that import one of them (``train.py`` beside a named
    ``model.py``): a helper named alone is read with the scripts that use it. Each sibling
    parsed here is kept in ``parsed`` (by resolved path, with its text) for the analysis."""
    named = {disk.resolve(f) for f in files}
    found: list[Path] = []
    for folder in dict.fromkeys(disk.resolve(f).parent for f in files):
        stems = {f.stem for f in named if f.parent == folder}
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
            parsed[disk.resolve(sibling)] = (text, tree)
            if local_imports(tree, disk.resolve(sibling), disk=disk) & named:
                found.append(sibling)
    return found


def _load(path: Path, key: Path, disk: Disk,
          parsed: dict[Path, tuple[str, ast.Module]]) -> tuple[Facts | Finding, set[Path]]:
    """One file's facts (or why it cannot be read) and the local modules it imports."""
    source = _read(path)
    if isinstance(source, Finding):
        return source, set()
    text, tree = parsed.pop(key, ("", None))
    # a sibling read as UTF-8 is parsed once; another encoding reads differently: parse again
    facts = _parse(source, str(path), tree if text == source else None)
    if isinstance(facts, Finding):
        return facts, set()
    return facts, local_imports(facts.tree, key, facts.of(ast.Import, ast.ImportFrom), disk)


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
    projects = {}
    for key in parts:
        together = set().union(*(closures[a] for a in reach(key, importers)))
        projects[key] = merge(parts[k] for k in sorted(together))
    return projects


def _analyse(files: list[Path], rules: tuple[Rule, ...], context: list[Path] = (),  # type: ignore[assignment]
             disk: Disk | None = None,
             parsed: dict[Path, tuple[str, ast.Module]] | None = None) -> dict[Path, list[Finding]]:
    """Findings per file for ``files`` and the local modules they import, each file read
    together with the modules it is connected to by imports. ``context`` files are read
    for what they show about the others; their own findings are not returned."""
    disk = Disk() if disk is None else disk
    parsed = {} if parsed is None else parsed
    hidden = {disk.resolve(f) for f in context}
    files = [*files, *context]
    shown = {disk.resolve(f): f for f in files}
    facts: dict[Path, Facts] = {}
    failed: dict[Path, list[Finding]] = {}
    edges: dict[Path, set[Path]] = {}
    queue = list(shown)
    while queue:
        key = queue.pop()
        if key in facts or key in failed:
            continue
        loaded, edges[key] = _load(shown.get(key, key), key, disk, parsed)
        if isinstance(loaded, Finding):
            failed[key] = [loaded]
            continue
        facts[key] = loaded
        queue.extend(edges[key] - facts.keys())
    projects = projects_of(edges, {key: file_project(f) for key, f in facts.items()})
    results = {k: v for k, v in failed.items() if k not in hidden}
    for key, f in facts.items():
        if key not in hidden:
            results[key] = _run_rules(with_project(f, projects[key]), rules)
    return results


def check_file(path: str | Path, rules: Iterable[Rule] | None = None) -> list[Finding]:
    """Findings for one file, read together with the local modules it imports."""
    rules = all_rules() if rules is None else tuple(rules)
    path = Path(path)
    disk: Disk = Disk()
    parsed: dict[Path, tuple[str, ast.Module]] = {}
    with _collector_paused():
        context = _importers_beside([path], disk, parsed)
        return _analyse([path], rules, context, disk, parsed).get(disk.resolve(path), [])


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


def check_paths(paths: Iterable[str | Path],
                rules: Iterable[Rule] | None = None) -> tuple[list[Finding], int]:
    """Findings for every file under ``paths`` and the local modules they import, and how
    many files were checked."""
    rules = all_rules() if rules is None else tuple(rules)
    files = list(dict.fromkeys(iter_python_files(paths)))
    disk: Disk = Disk()
    parsed: dict[Path, tuple[str, ast.Module]] = {}
    with _collector_paused():
        results = _analyse(files, rules, _importers_beside(files, disk, parsed), disk, parsed)
    named = {disk.resolve(f) for f in files}
    extra = sorted(k for k in results if k not in named)  # imported modules outside `paths`
    order = [disk.resolve(f) for f in files] + extra
    findings = [f for key in dict.fromkeys(order) for f in results.get(key, [])]
    return findings, len(order)
