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

from splitsync.tools.lint.evidence import framework_of, logging_configured, logging_rank_limited
from splitsync.tools.lint.facts import Facts, last_name
from splitsync.tools.lint.flow import is_rank_like
from splitsync.tools.lint.model import Project
from splitsync.tools.lint.rules.data import sharded

__all__ = ["local_imports", "project_of", "file_project", "merge", "with_project", "overrides_print", "same_seed",
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
    # `python -m apps.x.train` run from the repository root: the script's folder is not a
    # package, but `lingua/` beside `apps/` is; such ancestors resolve only package imports
    for parent in list(folder.parents)[:3]:
        if parent not in roots:
            roots.append(parent)
    return roots


def _roots_own_top(path: Path) -> Path:
    """The package root of ``path`` (its folder when it is in no package)."""
    top = path.parent
    while (top / "__init__.py").exists() and top.parent != top:
        top = top.parent
    return top


def _module_file(base: Path, dotted_name: str) -> Path | None:
    target = base.joinpath(*dotted_name.split(".")) if dotted_name else base
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def local_imports(tree: ast.Module, path: Path,
                  nodes: Iterable[ast.AST] | None = None) -> set[Path]:
    """The project files ``tree`` (read from ``path``; ``nodes``: its nodes, if already
    listed) imports."""
    found: set[Path] = set()
    roots = _roots(path)
    ancestors = set(roots[1:]) - {_roots_own_top(path)}
    for node in ast.walk(tree) if nodes is None else nodes:
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
                if base in ancestors and not (base / name.split(".")[0] / "__init__.py").is_file():
                    continue  # an ancestor folder resolves packages only, never a stray file
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


def file_project(f: Facts) -> Project:
    """What one file contributes to its project (read once per file, then merged)."""
    return Project(
        files=(f.path,),
        print_override=overrides_print(f),
        called=frozenset(name for c, _ in f.calls if (name := last_name(c))),
        mentioned=f.loaded_names,
        wrapped=_wraps(f),
        distributed=f.is_distributed or framework_of(f) is not None,
        same_seed=same_seed(f),
        log_rank_limited=logging_rank_limited([f]),
        log_configured=logging_configured([f]),
        framework=framework_of(f),
        sharded=sharded(f),
    )


def merge(parts: Iterable[Project]) -> Project:
    """The :class:`Project` of files read together, from each file's own part."""
    parts = list(parts)
    return Project(
        files=tuple(p for part in parts for p in part.files),
        print_override=any(p.print_override for p in parts),
        called=frozenset().union(*(p.called for p in parts)),
        mentioned=frozenset().union(*(p.mentioned for p in parts)),
        wrapped=any(p.wrapped for p in parts),
        distributed=any(p.distributed for p in parts),
        same_seed=any(p.same_seed for p in parts),
        log_rank_limited=any(p.log_rank_limited for p in parts),
        log_configured=any(p.log_configured for p in parts),
        framework=next((p.framework for p in parts if p.framework), None),
        sharded=any(p.sharded for p in parts),
    )


def project_of(members: Iterable[Facts]) -> Project:
    """The :class:`Project` of files read together."""
    return merge(file_project(f) for f in members)


def with_project(facts: Facts, project: Project | None = None) -> Facts:
    """``facts`` knowing its project (itself alone when ``project`` is None)."""
    return replace(facts, project=project or project_of([facts]))
