"""Follow a script's own imports: the local modules it imports (and that import it) are read
together, so a ``set_epoch`` in a helper module or a ``print`` override in ``utils/misc.py``
is seen from the script.

A local import is one that resolves to a ``.py`` file next to the script or under its package
root; everything else (torch, third-party packages) is ignored. Nothing is imported or run.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import unicodedata
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath

from splitsync.check.evidence import (
    forced_prints,
    framework_of,
    logging_configured,
    logging_rank_limited,
)
from splitsync.check.facts import Facts, last_name
from splitsync.check.groups import collective_functions, optional_group
from splitsync.check.model import Project
from splitsync.check.ranks import is_rank_like, rank_in
from splitsync.check.reach import FOREIGN, call_graph, reached, resolve
from splitsync.check.sharding import sharded

__all__ = ["Disk", "local_imports", "unseen_imports", "project_of", "file_project", "merge",
           "with_project", "overrides_print", "same_seed", "is_seed_call"]

_WRAPS = frozenset({"DistributedDataParallel", "FullyShardedDataParallel", "fully_shard"})
_BUILTINS = frozenset({"builtins", "__builtin__", "__builtins__"})


@dataclass(frozen=True)
class Disk:
    """What one check run has asked the filesystem: import resolution tests the same few
    candidate paths for every file of a project, so each is looked up once per run."""

    answers: dict[tuple[str, Path], object] = field(default_factory=dict)

    def is_file(self, path: Path) -> bool:
        """``path.is_file()``, asked once."""
        key = ("is_file", path)
        if key not in self.answers:
            self.answers[key] = path.is_file()
        return self.answers[key]  # type: ignore[return-value]

    def exists(self, path: Path) -> bool:
        """``path.exists()``, asked once."""
        key = ("exists", path)
        if key not in self.answers:
            self.answers[key] = path.exists()
        return self.answers[key]  # type: ignore[return-value]

    def may_hold(self, folder: Path, name: str) -> bool:
        """Could ``folder`` hold an entry called ``name``? A superset test (case and Unicode
        form folded, as some filesystems do) that spares a lookup for every import of a
        package that is not local (``torch``, ``numpy``) in every folder it is tried in."""
        key = ("names", folder)
        if key not in self.answers:
            try:
                self.answers[key] = frozenset(_fold(n) for n in os.listdir(folder))
            except OSError:
                self.answers[key] = None  # unreadable: every lookup asks the filesystem
        names = self.answers[key]
        return names is None or _fold(name) in names  # type: ignore[operator]

    def resolve(self, path: Path) -> Path:
        """``path.resolve()``, asked once."""
        key = ("resolve", path)
        if key not in self.answers:
            self.answers[key] = path.resolve()
        return self.answers[key]  # type: ignore[return-value]


def _fold(name: str) -> str:
    return unicodedata.normalize("NFKC", name).casefold()


def _roots(path: Path, disk: Disk) -> list[Path]:
    """Where the script's absolute imports resolve: its folder and its package root."""
    folder = path.parent
    roots = [folder]
    top = _roots_own_top(path, disk)
    if top != folder:
        roots.append(top)
    # `python -m apps.x.train` run from the repository root: the script's folder is not a
    # package, but `lingua/` beside `apps/` is; such ancestors resolve only package imports
    for parent in list(folder.parents)[:3]:
        if parent not in roots:
            roots.append(parent)
    return roots


def _roots_own_top(path: Path, disk: Disk) -> Path:
    """The package root of ``path`` (its folder when it is in no package)."""
    top = path.parent
    while disk.exists(top / "__init__.py") and top.parent != top:
        top = top.parent
    return top


def _module_file(base: Path, dotted_name: str, disk: Disk) -> Path | None:
    target = base.joinpath(*dotted_name.split(".")) if dotted_name else base
    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
        if disk.is_file(candidate):
            return candidate
    return None


def _candidates(path: Path, folder: str, level: int, name: str,
                disk: Disk) -> tuple[Path, ...]:
    """The files ``name`` could be, imported from ``path``'s folder (``folder``, as text) with
    ``level`` dots, in the order they are tried; asked once per folder and name in a run."""
    key = ("module", folder, level, name)
    if key in disk.answers:
        return disk.answers[key]  # type: ignore[return-value]
    where = ("roots", folder)
    if where not in disk.answers:
        roots = _roots(path, disk)
        disk.answers[where] = (roots, set(roots[1:]) - {_roots_own_top(path, disk)})
    roots, ancestors = disk.answers[where]  # type: ignore[misc]
    if level:
        base = path.parent
        for _ in range(level - 1):
            base = base.parent
        bases = [base]
    else:
        bases = roots
    head = name.split(".")[0]
    hits = []
    for base in bases:
        if head and not (disk.may_hold(base, head) or disk.may_hold(base, head + ".py")):
            continue  # neither `head/` nor `head.py` here: no candidate can be a file
        if base in ancestors and "." not in name \
                and not disk.is_file(base / name.split(".")[0] / "__init__.py"):
            continue  # an ancestor folder resolves packages only, never a stray file
        # (a dotted name may be in a namespace package: a folder with no __init__.py)
        hit = _module_file(base, name, disk)
        if hit is not None:
            hits.append(disk.resolve(hit))
    disk.answers[key] = found = tuple(hits)
    return found


def local_imports(tree: ast.Module, path: Path,
                  nodes: Iterable[ast.AST] | None = None, disk: Disk | None = None) -> set[Path]:
    """The project files ``tree`` (read from ``path``; ``nodes``: its nodes, or at least its
    import statements, if already listed) imports. ``disk`` shares filesystem answers
    between the files of one run."""
    disk = Disk() if disk is None else disk
    found: set[Path] = set()
    own = disk.resolve(path)
    folder = str(path.parent)
    for node in ast.walk(tree) if nodes is None else nodes:
        names: list[tuple[int, str]] = []
        if isinstance(node, ast.Import):
            names = [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [(node.level, module)]
            # `from util import misc` imports a module, not a name
            names += [(node.level, f"{module}.{a.name}" if module else a.name)
                      for a in node.names]
        for level, name in names:
            hit = next((h for h in _candidates(path, folder, level, name, disk) if h != own),
                       None)
            if hit is not None:
                found.add(hit)
    return found


def _installed(top: str, disk: Disk) -> bool:
    """Is ``top`` a module of the standard library or an installed package (found on
    ``sys.path`` without importing it)? A lookup that fails counts as installed: no claim."""
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top in FOREIGN:
        return True  # (a well-known package counts even where it is not installed)
    key = ("installed", top)
    if key not in disk.answers:
        try:
            disk.answers[key] = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            disk.answers[key] = True
    return disk.answers[key]  # type: ignore[return-value]


def _optional_imports(tries: Iterable[ast.AST]) -> set[int]:
    """Ids of the imports inside ``try: ... except ImportError:`` (optional dependencies)."""
    found: set[int] = set()
    for node in tries:
        if not isinstance(node, ast.Try):
            continue
        caught = {last_name(h.type) for h in node.handlers if h.type is not None}
        caught |= {last_name(e) for h in node.handlers if isinstance(h.type, ast.Tuple)
                   for e in h.type.elts}
        if caught & {"ImportError", "ModuleNotFoundError", "Exception"} or any(
                h.type is None for h in node.handlers):
            found.update(id(n) for s in node.body for n in ast.walk(s)
                         if isinstance(n, ast.Import | ast.ImportFrom))
    return found


def unseen_imports(tree: ast.Module, path: Path, nodes: Iterable[ast.AST] | None = None,
                   disk: Disk | None = None, tries: Iterable[ast.AST] | None = None
                   ) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """Imports of ``tree`` (read from ``path``) that name a module of the project the checker
    could not read: ``(line, module, names it binds)`` for a relative import that resolves to
    no file, or an absolute one that is neither a file of the project, the standard library
    nor an installed package. Optional imports (under ``except ImportError``) are left out
    (``tries``: the file's ``try`` statements, if already listed)."""
    disk = Disk() if disk is None else disk
    folder = str(path.parent)
    found: list[tuple[int, str, tuple[str, ...]]] = []
    optional: set[int] | None = None  # walked once, and only if some import is not found
    for node in ast.walk(tree) if nodes is None else nodes:
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            named = [module, *(f"{module}.{a.name}" if module else a.name for a in node.names)]
            if any(_candidates(path, folder, node.level, t, disk) for t in named if t):
                continue
            if not node.level and (not module or _installed(module.split(".")[0], disk)):
                continue
            bound = tuple(a.asname or a.name for a in node.names if a.name != "*")
            optional = _optional_imports(ast.walk(tree) if tries is None else tries) if optional is None else optional
            if id(node) not in optional:
                found.append((node.lineno, "." * node.level + module, bound))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if _candidates(path, folder, 0, alias.name, disk) or _installed(top, disk):
                    continue
                optional = _optional_imports(ast.walk(tree) if tries is None else tries) if optional is None else optional
                if id(node) not in optional:
                    found.append((node.lineno, alias.name, (alias.asname or top,)))
    return tuple(found)


def overrides_print(facts: Facts) -> bool:
    """Does the file replace ``print`` for the whole process (``builtins.print = print``)?"""
    for node in facts.of(ast.Assign):
        for target in node.targets:  # type: ignore[attr-defined]
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
    for node in facts.of(ast.Assign):
        if rank_in(facts, node.value):  # type: ignore[attr-defined]
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))  # type: ignore[attr-defined]
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
    seeds = [n for n in facts.call_names() if "seed" in n.lower()]  # few: read only those
    derived = _rank_derived(facts) if seeds else set()
    for call in facts.named_calls(*seeds) if seeds else ():
        if not is_seed_call(call) or not (call.args or call.keywords) \
                or not _global_seed(facts, call):
            continue
        parts = [n for a in [*call.args, *(k.value for k in call.keywords)]
                 for n in facts.subtree(a)]
        if not any(is_rank_like(n) or (isinstance(n, ast.Name) and n.id in derived)
                   or "offset" in (last_name(n) or "") for n in parts):
            return True
    return bool(facts.init_calls())  # splitsync.init seeds every rank alike


def _wraps(facts: Facts) -> bool:
    return bool(facts.torch_calls(*_WRAPS) or facts.run_calls("model"))


def file_project(f: Facts, unseen: Iterable[tuple[int, str, tuple[str, ...]]] = ()) -> Project:
    """What one file contributes to its project (read once per file, then merged);
    ``unseen``: its imports of modules the checker could not read (:func:`unseen_imports`)."""
    entry, main_entry, edges, (outside, api), referenced = call_graph(f)
    framework = framework_of(f)
    unseen = tuple(unseen)
    return Project(
        files=(f.path,),
        unseen=frozenset(f"{f.path}\t{line}\t{module}" for line, module, _ in unseen),
        unseen_names=frozenset(n for _, _, names in unseen for n in names),
        print_override=overrides_print(f) or forced_prints(f),
        called=f.call_names() - {""},
        mentioned=f.loaded_names,
        wrapped=_wraps(f),
        # a module that wraps a model in DDP or creates the process group runs in a
        # distributed program even when it is not the script (minGPT-ddp's Trainer)
        distributed=f.is_distributed or framework is not None or _wraps(f)
        or bool(f.torch_calls("init_process_group")),
        same_seed=same_seed(f),
        log_rank_limited=logging_rank_limited([f]),
        log_configured=logging_configured([f]),
        framework=framework,
        sharded=sharded(f),
        entry=entry,
        main_entry=main_entry,
        edges=edges,
        outside=outside,
        api=api,
        has_script=f.is_script,
        referenced=referenced,
        collectives=collective_functions(f),
        optional_group=optional_group(f),
    )


def merge(parts: Iterable[Project], imported: Collection[str] = ()) -> Project:
    """The :class:`Project` of files read together, from each file's own part
    (``imported``: the files another of them imports, whose ``__main__`` blocks never run)."""
    parts = list(parts)
    stems = {PurePath(f).stem for p in parts for f in p.files}
    entry = frozenset().union(*(p.entry for p in parts),
                              *(p.main_entry for p in parts if p.files[0] not in imported))
    mentioned = frozenset().union(*(p.mentioned for p in parts))
    referenced = frozenset(resolve(frozenset().union(*(p.referenced for p in parts)), stems))
    outside = frozenset().union(*(p.outside for p in parts))
    if not any(p.has_script for p in parts):  # a library: its API is called from outside
        outside |= frozenset().union(*(p.api for p in parts))
    edges: dict[str, frozenset[str]] = {}
    for part in parts:  # `mod:f` names are resolved against `stems` as they are reached
        for name, called in part.edges.items():
            edges[name] = edges[name] | called if name in edges else called
    return Project(
        files=tuple(p for part in parts for p in part.files),
        unseen=frozenset().union(*(p.unseen for p in parts)),
        unseen_names=frozenset().union(*(p.unseen_names for p in parts)),
        print_override=any(p.print_override for p in parts),
        called=frozenset().union(*(p.called for p in parts)),
        mentioned=mentioned,
        wrapped=any(p.wrapped for p in parts),
        distributed=any(p.distributed for p in parts),
        same_seed=any(p.same_seed for p in parts),
        log_rank_limited=any(p.log_rank_limited for p in parts),
        log_configured=any(p.log_configured for p in parts),
        framework=next((p.framework for p in parts if p.framework), None),
        sharded=any(p.sharded for p in parts),
        entry=entry,
        edges=edges,
        outside=outside,
        has_script=any(p.has_script for p in parts),
        referenced=referenced,
        collectives=frozenset().union(*(p.collectives for p in parts)),
        optional_group=any(p.optional_group for p in parts),
        reach=reached(entry, edges, outside, referenced, stems),
    )


def project_of(members: Iterable[Facts]) -> Project:
    """The :class:`Project` of files read together."""
    return merge(file_project(f) for f in members)


def with_project(facts: Facts, project: Project | None = None) -> Facts:
    """``facts`` knowing its project (itself alone when ``project`` is None)."""
    return replace(facts, project=project or project_of([facts]))
