"""What a script is, read once from its AST: imports, calls, scopes, and what kind of script.

Rules read these facts instead of walking the tree again. Nothing here imports or runs the
script (or torch): the checker must work on a machine without either.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from splitsync.check.index import TreeIndex, index_tree
from splitsync.check.model import Project

__all__ = ["Facts", "build_facts", "dotted", "last_name", "in_order", "SCOPES", "SETUP_HELPER"]

#: Nodes that open a new variable scope.
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)
_INIT_NAMES = frozenset({"splitsync.init", "splitsync.run.runtime.init", "splitsync.api.init"})
#: Calls that, made at module level, show the file is a training script.
_WORK = frozenset({"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "fully_shard",
                   "init_process_group", "init", "backward", "DataLoader", "model", "loader"})
_LAUNCH_VARS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE"})
#: Names of helpers that set up the process group (``setup_ddp``, ``init_distributed_mode``).
SETUP_HELPER = re.compile(r"(init|setup).*(dist|ddp|process_group)|(dist|ddp).*(init|setup)", re.I)
_SPAWNERS = frozenset({"spawn", "start_processes", "Process", "elastic_launch"})


def dotted(expr: ast.AST) -> str | None:
    """``a.b.c`` for a name or attribute chain, else None."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
        return ".".join(reversed(parts))
    return None


def last_name(expr: ast.AST) -> str | None:
    """The last identifier of a name, attribute or call: ``c`` for ``a.b.c(...)``."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None


def in_order(node: ast.AST) -> Iterator[ast.AST]:
    """Depth-first, source-ordered walk of ``node`` and everything below it."""
    stack = [node]  # iterative: long expression chains are deeper than the recursion limit
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(list(ast.iter_child_nodes(current))))


@dataclass(frozen=True, eq=False)
class Facts:
    """The parsed script and what the rules need to know about it."""

    path: str
    source: str
    tree: ast.Module
    aliases: dict[str, str]
    parents: dict[ast.AST, ast.AST]
    calls: tuple[tuple[ast.Call, str], ...]
    classes: frozenset[str]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
    run_names: frozenset[str]
    is_splitsync: bool
    is_distributed: bool
    uses_spawn: bool
    is_script: bool
    loaded_names: frozenset[str]
    nodes: tuple[ast.AST, ...] = ()
    #: The source split into lines (ends kept), for quoting code.
    lines: tuple[str, ...] = ()
    rank0_functions: frozenset[str] = field(default_factory=frozenset)
    #: Names assigned only from rank-0 tests (``should_log = is_main_process()``).
    rank0_flags: frozenset[str] = field(default_factory=frozenset)
    project: Project = field(default_factory=Project)
    #: The one walk of ``tree`` that ``nodes`` and ``parents`` come from.
    index: TreeIndex | None = None

    @property
    def in_distributed_run(self) -> bool:
        """Is this file a distributed script, or a module of one (its helpers run per rank)?"""
        return self.is_distributed or self.project.distributed

    def text(self, node: ast.AST, limit: int = 70) -> str:
        """The source of ``node`` as the author wrote it, on one line, shortened to ``limit``."""
        raw = self._segment(node) or ast.unparse(node)
        text = " ".join(raw.split()) if "\n" in raw else raw
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def _segment(self, node: ast.AST) -> str | None:
        """``ast.get_source_segment`` without re-splitting the whole source on every call."""
        try:
            first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
            start, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        except AttributeError:
            return None
        if first is None or last is None or end is None or last >= len(self.lines):
            return None
        if first == last:
            return self.lines[first].encode()[start:end].decode(errors="replace")
        parts = [self.lines[first].encode()[start:].decode(errors="replace"),
                 *self.lines[first + 1:last],
                 self.lines[last].encode()[:end].decode(errors="replace")]
        return "".join(parts)

    # --- names -------------------------------------------------------------------------
    def resolve(self, expr: ast.AST) -> str | None:
        """The dotted name with import aliases expanded: ``nn.Linear`` → ``torch.nn.Linear``."""
        name = dotted(expr)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        full = self.aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    def is_torch(self, expr: ast.AST, *names: str) -> bool:
        """True when ``expr`` resolves to a torch object whose last name is one of ``names``.

        A bare, unimported name counts too: the lesson's snippets use names defined elsewhere.
        """
        full = self.resolve(expr.func if isinstance(expr, ast.Call) else expr)
        if full is None:
            return False
        last = full.rsplit(".", 1)[-1]
        return last in names and (full.startswith("torch.") or full == last)

    def _calls_by(self) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """Positions in ``calls`` of torch calls by last name, and of method calls by method."""
        memo = self.tree_index.memo
        known = memo.get("calls")
        if known is None or known[0] is not self.calls:  # type: ignore[index]
            torch: dict[str, list[int]] = {}
            methods: dict[str, list[int]] = {}
            for at, (call, full) in enumerate(self.calls):
                last = full.rsplit(".", 1)[-1]
                if full.startswith("torch.") or full == last:
                    torch.setdefault(last, []).append(at)
                if isinstance(call.func, ast.Attribute):
                    methods.setdefault(call.func.attr, []).append(at)
            known = memo["calls"] = (self.calls, torch, methods)
        return known[1], known[2]  # type: ignore[index]

    def named_calls(self, *names: str) -> list[ast.Call]:
        """Calls whose last name is one of ``names`` (``f(...)``, ``a.b.f(...)``), in source
        order, from an index of every call by last name built once per tree."""
        memo = self.tree_index.memo
        known = memo.get("named")
        if known is None or known[0] is not self.calls:  # type: ignore[index]
            by_name: dict[str, list[int]] = {}
            for at, (call, full) in enumerate(self.calls):
                by_name.setdefault(full.rsplit(".", 1)[-1] if full else (
                    last_name(call) or ""), []).append(at)
            known = memo["named"] = (self.calls, by_name)
        by_name = known[1]  # type: ignore[index]
        if len(names) == 1:
            return [self.calls[at][0] for at in by_name.get(names[0], ())]
        return [self.calls[at][0] for at in sorted({at for n in names for at in by_name.get(n, ())})]

    def call_names(self) -> frozenset[str]:
        """The last names of every call of the file."""
        self.named_calls("")
        return frozenset(self.tree_index.memo["named"][1])  # type: ignore[index]

    def torch_calls(self, *names: str) -> list[ast.Call]:
        """Calls of torch functions or classes named ``names`` (any import spelling)."""
        by_name = self._calls_by()[0]
        return [self.calls[at][0] for at in sorted({at for n in names for at in by_name.get(n, ())})]

    def method_calls(self, *attrs: str) -> list[ast.Call]:
        """Calls ``<anything>.attr(...)``."""
        by_attr = self._calls_by()[1]
        return [self.calls[at][0] for at in sorted({at for a in attrs for at in by_attr.get(a, ())})]

    def is_run(self, expr: ast.AST) -> bool:
        """Is ``expr`` the splitsync Run handle (``run`` from ``splitsync.init``)?"""
        return isinstance(expr, ast.Name) and expr.id in self.run_names

    def run_calls(self, *attrs: str) -> list[ast.Call]:
        """Calls ``run.attr(...)`` on the splitsync Run handle."""
        return [c for c in self.method_calls(*attrs) if self.is_run(c.func.value)]  # type: ignore[attr-defined]

    def init_calls(self) -> list[ast.Call]:
        """Calls of ``splitsync.init``."""
        return [c for c, full in self.calls if full in _INIT_NAMES]

    # --- structure ---------------------------------------------------------------------
    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """Parents of ``node``, nearest first, up to the module."""
        while node in self.parents:
            node = self.parents[node]
            yield node

    def scope(self, node: ast.AST) -> ast.AST:
        """The function (or the module) whose local variables ``node`` sees."""
        for parent in self.ancestors(node):
            if isinstance(parent, SCOPES):
                return parent
        return self.tree

    def scope_name(self, node: ast.AST) -> str:
        """``train()`` or ``module level`` - for messages."""
        scope = self.scope(node)
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            return f"in {scope.name}()"
        return "at module level"

    def walk_scope(self, scope: ast.AST) -> Iterator[ast.AST]:
        """Nodes of one scope in source order, not entering nested functions or classes."""
        return self.tree_index.walk_scope(scope)

    @property
    def tree_index(self) -> TreeIndex:
        """The index of ``tree`` (:func:`build_facts` makes it; built again if missing)."""
        return self.index if self.index is not None else index_tree(self.tree)

    def of(self, *types: type) -> tuple[ast.AST, ...]:
        """The nodes of these types, in source order (``facts.of(ast.Assign)``)."""
        return self.tree_index.of(*types)

    def inside(self, node: ast.AST, kind: type) -> tuple[ast.AST, ...]:
        """The nodes of type ``kind`` below ``node`` (and itself), in source order."""
        return self.tree_index.inside(node, kind)

    def subtree(self, node: ast.AST) -> tuple[ast.AST, ...]:
        """``node`` and every node below it (what ``ast.walk(node)`` visits)."""
        return self.tree_index.subtree(node)

    def main_block(self) -> ast.If | None:
        """The ``if __name__ == "__main__":`` block, if any."""
        for stmt in self.tree.body:
            if isinstance(stmt, ast.If) and "__main__" in ast.unparse(stmt.test):
                return stmt
        return None


def _aliases(index: TreeIndex) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in index.of(ast.Import, ast.ImportFrom):  # in source order: a later import wins
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    found[a.asname] = a.name
                else:
                    head = a.name.split(".")[0]
                    found[head] = head
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                found[a.asname or a.name] = f"{node.module}.{a.name}"
    return found


def _run_names(index: TreeIndex, init_calls: list[ast.Call],
               imports_splitsync: bool) -> set[str]:
    names = {"run"} if imports_splitsync else set()
    ids = {id(c) for c in init_calls}
    if ids:
        for node in index.of(ast.Assign):
            if id(node.value) in ids:  # type: ignore[attr-defined]
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))  # type: ignore[attr-defined]
        for node in index.of(ast.withitem):
            if id(node.context_expr) in ids and isinstance(node.optional_vars, ast.Name):  # type: ignore[attr-defined]
                names.add(node.optional_vars.id)  # type: ignore[attr-defined]
    for node in index.of(ast.arg):
        if node.annotation is not None and (  # type: ignore[attr-defined]
                last_name(node.annotation) or "").endswith("Run"):  # type: ignore[attr-defined]
            names.add(node.arg)  # type: ignore[attr-defined]
    return names


def _runs_code(body: list[ast.stmt]) -> bool:
    """Does module-level code do work (a script), rather than only define things (a library)?"""
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            return True
        if isinstance(stmt, ast.For | ast.While | ast.With | ast.AsyncWith | ast.AsyncFor):
            return True
        if isinstance(stmt, ast.If | ast.Try) and (_runs_code(stmt.body) or _runs_code(
                stmt.orelse)):
            return True
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None and any(
                last_name(n) in _WORK for n in ast.walk(stmt.value) if isinstance(n, ast.Call)):
            return True
    return False


def build_facts(tree: ast.Module, path: str, source: str = "",
                index: TreeIndex | None = None) -> Facts:
    """Read ``tree`` once (``index``: its index, if already built); rank-0 function analysis
    is added by :mod:`splitsync.check.flow`."""
    index = index_tree(tree) if index is None or index.nodes[0] is not tree else index
    nodes, parents = index.nodes, index.parents
    calls = index.of(ast.Call)
    loaded = {n.id for n in index.of(ast.Name) if isinstance(n.ctx, ast.Load)}  # type: ignore[attr-defined]
    loaded.update(n.attr for n in index.of(ast.Attribute))  # type: ignore[attr-defined]
    aliases = _aliases(index)
    facts = Facts(path=path, source=source, tree=tree, aliases=aliases, parents=parents, calls=(),
                  classes=frozenset(), functions={}, run_names=frozenset(), is_splitsync=False,
                  is_distributed=False, uses_spawn=False, is_script=False,
                  loaded_names=frozenset(loaded),
                  nodes=nodes, lines=tuple(source.splitlines(keepends=True)), index=index)
    resolved = tuple((c, facts.resolve(c.func) or "") for c in calls)  # type: ignore[attr-defined]
    facts = replace(facts, calls=resolved)
    init_calls = facts.init_calls()
    imports_ss = any(v == "splitsync" or v.startswith("splitsync.") for v in aliases.values())
    functions = {s.name: s for s in tree.body
                 if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)}
    # Signs the script runs as one of several processes: a process group (directly, through a
    # setup helper, or splitsync), a DDP/FSDP wrap, or the launcher's rank variables.
    launched = any(n.value in _LAUNCH_VARS for n in index.of(ast.Constant))  # type: ignore[attr-defined]
    helper = any(SETUP_HELPER.search(full.rsplit(".", 1)[-1]) for _, full in resolved)
    distributed = bool(init_calls or launched or helper or facts.torch_calls(
        "DistributedDataParallel", "FullyShardedDataParallel", "fully_shard", "init_process_group"))
    spawn = any(last_name(c) in _SPAWNERS for c, _ in resolved)
    script = _runs_code(tree.body)
    return replace(
        facts,
        classes=frozenset(n.name for n in index.of(ast.ClassDef)),  # type: ignore[attr-defined]
        functions=functions,
        run_names=frozenset(_run_names(index, init_calls, imports_ss)),
        is_splitsync=bool(init_calls),
        is_distributed=distributed and script,
        uses_spawn=spawn,
        is_script=script,
    )
