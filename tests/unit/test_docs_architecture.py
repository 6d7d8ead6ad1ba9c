"""docs/architecture.md tells the truth: every file it names exists, each symbol it pins to a
file is defined there, the limits it states are the ones tests/unit/test_layers.py applies,
and its layer list covers every folder, in the layering test's order."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import test_layers as layers  # the same directory: pytest puts it on the path

import splitsync

REPO = Path(__file__).resolve().parents[2]
SRC = Path(splitsync.__file__).resolve().parent
DOC = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")

# `path.py` or `folder/`, as the doc writes them (placeholders such as <name> are skipped)
PATH = re.compile(r"`((?:[\w.-]+/)*[\w.-]+(?:\.py|/))`")
# `path.py` (`Name` or `path.py` `Name`: a class or function the doc says lives there
PINNED = re.compile(r"`((?:[\w-]+/)*[\w-]+\.py)` \(?`([A-Za-z_]\w*)")


def _where(rel: str) -> Path | None:
    for base in (SRC, REPO):
        if (base / rel).exists():
            return base / rel
    if "/" not in rel.rstrip("/"):  # a bare name, in a row that names its folder
        return next(iter(SRC.rglob(rel.rstrip("/"))), None)
    return None


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.name for n in ast.walk(tree)
             if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              if isinstance(t, ast.Name)}
    return names


def test_every_file_and_folder_the_doc_names_exists() -> None:
    named = sorted(set(PATH.findall(DOC)))
    assert len(named) > 60, named  # the pattern still matches the doc
    missing = [rel for rel in named if _where(rel) is None]
    assert not missing, f"docs/architecture.md names what is not there: {missing}"


def test_each_symbol_pinned_to_a_file_is_defined_there() -> None:
    pins = PINNED.findall(DOC)
    assert len(pins) > 15, pins
    wrong = [f"{rel}: {name}" for rel, name in pins
             if (path := _where(rel)) is not None and name not in _defined(path)]
    assert not wrong, wrong


def test_the_stated_limits_are_the_tested_ones() -> None:
    ckpt = re.search(r"more than (\d+) online checkpoint modules", DOC)
    assert ckpt and int(ckpt.group(1)) == layers.MAX_CKPT_MODULES
    assert len(list((SRC / "ckpt").glob("*.py"))) <= layers.MAX_CKPT_MODULES
    top = re.search(r"more than (\d+) top-level modules", DOC)
    assert top and int(top.group(1)) == 14
    cap = re.search(r"each is at most (\d+) lines", DOC)
    assert cap and int(cap.group(1)) == 150
    long = {p.name: n for p in (SRC / "commands").glob("*.py")
            if (n := p.read_text().count("\n")) > int(cap.group(1))}
    assert not long, f"commands are options and dispatch only: {long}"


def test_the_layer_list_covers_every_folder_in_the_tested_order() -> None:
    block = re.search(r"```\nsrc/splitsync/\n(.*?)```", DOC, flags=re.S)
    assert block
    names = "|".join(name for name, _ in layers.LAYERS)
    rows = re.findall(rf"^  (\S.*?) {{2,}}({names})(?: |$)", block.group(1), flags=re.M)
    order = list(dict.fromkeys(layer for _, layer in rows))
    assert order == [name for name, _ in layers.LAYERS], order
    listed = {w.rstrip("/") for names, _ in rows for w in names.split()}
    listed |= set(re.findall(r"^    (\S+\.py) ", block.group(1), flags=re.M))  # continued rows
    folders = {d.name for d in SRC.iterdir() if d.is_dir() and d.name != "__pycache__"}
    assert folders <= listed, sorted(folders - listed)
    top = {p.name for p in SRC.glob("*.py")}
    assert top <= listed, sorted(top - listed)


def test_every_feature_family_has_one_tools_package_and_a_command() -> None:
    for family in ("plan", "goodput", "verify", "audit"):
        assert (SRC / "tools" / family / "__init__.py").exists(), family
        assert (SRC / "commands" / f"{family}.py").exists(), family
        assert f"| {family} | `tools/{family}/`" in DOC, family
