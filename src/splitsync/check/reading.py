"""Read one file: its source, its facts, its suppression comments, and the rules' findings.

A finding is silenced by a comment on its line (or any line of the flagged expression):
``# splitsync: ignore[SS501]``, ``# splitsync: ignore[SS501, SS204]`` or ``# splitsync: ignore``
(every code). ``# splitsync: ignore-file[SS501]`` anywhere silences a code in the whole file.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from splitsync.check.facts import Facts, build_facts
from splitsync.check.flow import with_rank0_functions
from splitsync.check.index import TreeIndex
from splitsync.check.model import SEVERITIES, Finding, Rule
from splitsync.check.registry import META_CODES, all_rules

__all__ = ["Suppressions", "parse_suppressions", "parse", "read_source", "run_rules"]

_COMMENT = re.compile(r"#\s*splitsync:\s*ignore(-file)?\b(?:\[([^\]]*)\])?", re.IGNORECASE)
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


def parse(source: str, path: str, index: TreeIndex | None = None) -> Facts | Finding:
    """The file's facts, or the SS000 finding saying why it cannot be read (``index``: the
    source already parsed and indexed)."""
    if index is not None:
        return build_facts(index.nodes[0], path, source, index)  # type: ignore[arg-type]
    try:
        tree = ast.parse(source, filename=path)
    except RecursionError:
        return Finding("SS000", META_CODES["SS000"], "error",
                       f"cannot parse {path}: it is nested too deeply for Python's parser.",
                       "split the deepest expression into smaller statements.",
                       path, 1, 1, 1)
    except (SyntaxError, ValueError) as err:
        line = getattr(err, "lineno", None) or 1
        message = str(getattr(err, "msg", err))
        if sys.version_info < (3, 12) and message.startswith("f-string"):
            # PEP 701 (Python 3.12) allows quotes and backslashes inside f-strings: the file
            # may be valid Python that this interpreter's grammar cannot read
            return Finding("SS000", META_CODES["SS000"], "info",
                           f"cannot parse {path} with Python {sys.version_info[0]}."
                           f"{sys.version_info[1]}'s grammar ({message}); it may use the "
                           "f-string syntax of Python 3.12. No rule was checked.",
                           "run `splitsync check` with Python 3.12 or newer to check this file.",
                           path, line, getattr(err, "offset", None) or 1, line)
        return Finding("SS000", META_CODES["SS000"], "error",
                       f"cannot parse {path}: {message}; no rule was checked.",
                       "fix the syntax error (Python would refuse to run the script too).",
                       path, line, getattr(err, "offset", None) or 1, line)
    return build_facts(tree, path, source)


def _weaker(hit: str | None, rule: str) -> str:
    """A hit may lower its rule's severity, never raise it past the rule's (gated) level."""
    if hit is None:
        return rule
    return max(hit, rule, key=SEVERITIES.index)


def run_rules(facts: Facts, rules: tuple[Rule, ...]) -> list[Finding]:
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
    for entry in sorted(facts.project.unseen):
        where, line_text, module = entry.split("\t")
        if where == path and not quiet.silences("SS003", int(line_text), int(line_text)):
            found[("SS003", int(line_text), 1)] = Finding(
                "SS003", META_CODES["SS003"], "info",
                f"`{module}` is imported here but was not read (not among the files given, and "
                "no such file beside them): findings that depend on what it does are not "
                "claimed.", "pass that module too (or the folder that holds it).", path,
                int(line_text), 1, int(line_text))
    if "SS001" not in quiet.whole_file:
        for line, col, code in quiet.unknown:
            found[("SS001", line, col)] = Finding(
                "SS001", META_CODES["SS001"], "warning",
                f"`# splitsync: ignore[{code}]` names no rule, so it silences nothing.",
                "use a code from `splitsync check --list-rules`.", path, line, col, line)
    return _merged(sorted(found.values(), key=lambda f: (f.line, f.column, f.code)))


def _merged(findings: list[Finding]) -> list[Finding]:
    """One finding per rule and line: three calls on one line (``a.cuda(), b.cuda(),
    c.cuda()``) are one thing to fix, reported once at the first, with the count."""
    out: list[Finding] = []
    extra: dict[tuple[str, int], int] = {}
    for f in findings:
        key = (f.code, f.line)
        if key in extra:
            extra[key] += 1
            continue
        extra[key] = 0
        out.append(f)
    return [f if not extra[(f.code, f.line)] else replace(
        f, message=f"{f.message} (This line has {extra[(f.code, f.line)]} more such "
        f"call{'s' if extra[(f.code, f.line)] > 1 else ''}.)") for f in out]


def read_source(path: Path) -> str | Finding:
    try:
        with tokenize.open(path) as fh:
            return fh.read()
    except (SyntaxError, UnicodeDecodeError) as err:
        return Finding("SS000", META_CODES["SS000"], "error",
                       f"cannot read {path} as Python source: {err}.",
                       "save it as UTF-8 (or fix its coding cookie).", str(path), 1, 1, 1)
