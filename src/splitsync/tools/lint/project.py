"""Follow a script's own imports: the local modules it imports (and that import it) are read
together, so a ``set_epoch`` in a helper module or a ``print`` override in ``utils/misc.py``
is seen from the script.

A local import is one that resolves to a ``.py`` file next to the script or under its package
root; everything else (torch, third-party packages) is ignored. Nothing is imported or run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from splitsync.tools.lint.facts import Facts, last_name
from splitsync.tools.lint.flow import is_rank_like
from splitsync.tools.lint.model import Project

__all__ = ["local_imports", "project_of", "with_project", "overrides_print", "same_seed",
           "is_seed_call"]

_WRAPS = frozenset({"DistributedDataParallel", "FullyShardedDataParallel", "fully_shard"})
_BUILTINS = frozenset({"builtins", "__builtin__", "__builtins__"})


def _roots(path: Path) -> list[Path]:
    """Where the script's absolute imports resolve: its folder and its package root."""
    folder = path.parent
    roots = [folder]
    top = folder
    while (top / "__init__.py").exists() and top.parent != top:
        top = top.parent
    if top != folder:
        roots.append(top)
    return roots


def _module_file(base: Path, dotted_name: str) -> Path | None:
    target = base.joinpath(*dotted_name.split(".")) if dotted_name else base
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def local_imports(tree: ast.Module, path: Path) -> set[Path]:
    """The project files ``tree`` (read from ``path``) imports."""
    found: set[Path] = set()
    roots = _roots(path)
    for node in ast.walk(tree):
        names: list[tuple[list[Path], str]] = []
        if isinstance(node, ast.Import):
            names = [(roots, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                bases = [base]
            else:
                bases = roots
            module = node.module or ""
            names = [(bases, module)]
            # `from util import misc` imports a module, not a name
            names += [(bases, f"{module}.{a.name}" if module else a.name) for a in node.names]
        for bases, name in names:
            for base in bases:
                hit = _module_file(base, name)
                if hit is not None and hit.resolve() != path.resolve():
                    found.add(hit.resolve())
                    break
    return found


def overrides_print(facts: Facts) -> bool:
    """Does the file replace ``print`` for the whole process (``builtins.print = print``)?"""
    for node in facts.nodes:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "print" \
                    and isinstance(target.value, ast.Name) and target.value.id in _BUILTINS:
                return True
            if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
                    and target.slice.value == "print" and "builtin" in ast.unparse(target.value):
                return True
    return False


def is_seed_call(call: ast.Call) -> bool:
    """``torch.manual_seed(...)``, ``set_seed(...)``, ``np.random.seed(...)`` ..."""
    name = (last_name(call) or "").lower()
    return "seed" in name and not name.startswith(("get", "initial"))


def _rank_derived(facts: Facts) -> set[str]:
    names: set[str] = set()
    for node in facts.nodes:
        if isinstance(node, ast.Assign) and any(is_rank_like(n) for n in ast.walk(node.value)):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _global_seed(facts: Facts, call: ast.Call) -> bool:
    """A seed for a global generator (``torch.manual_seed``, ``set_seed``), not for one
    generator object (``torch.Generator().manual_seed(0)``, ``g.manual_seed(0)``)."""
    if isinstance(call.func, ast.Name):
        return True
    name = facts.resolve(call.func) if isinstance(call.func, ast.Attribute) else None
    return name is not None and name.split(".")[0] in set(facts.aliases.values()) | {
        "torch", "numpy", "random"}


def same_seed(facts: Facts) -> bool:
    """Is a seed set that every rank shares (not ``seed + rank``)?"""
    derived = _rank_derived(facts)
    for call, _ in facts.calls:
        if not is_seed_call(call) or not (call.args or call.keywords) \
                or not _global_seed(facts, call):
            continue
        parts = [n for a in [*call.args, *(k.value for k in call.keywords)] for n in ast.walk(a)]
        if not any(is_rank_like(n) or (isinstance(n, ast.Name) and n.id in derived)
                   or "offset" in (last_name(n) or "") for n in parts):
            return True
    return bool(facts.init_calls())  # splitsync.init seeds every rank alike


def _wraps(facts: Facts) -> bool:
    return bool(facts.torch_calls(*_WRAPS) or facts.run_calls("model"))


def project_of(members: Iterable[Facts]) -> Project:
    """The :class:`Project` of files read together."""
    members = list(members)
    return Project(
        files=tuple(f.path for f in members),
        print_override=any(overrides_print(f) for f in members),
        called=frozenset(name for f in members for c, _ in f.calls if (name := last_name(c))),
        mentioned=frozenset().union(*(f.loaded_names for f in members)),
        wrapped=any(_wraps(f) for f in members),
        distributed=any(f.is_distributed for f in members),
        same_seed=any(same_seed(f) for f in members),
    )


def with_project(facts: Facts, project: Project | None = None) -> Facts:
    """``facts`` knowing its project (itself alone when ``project`` is None)."""
    return replace(facts, project=project or project_of([facts]))
