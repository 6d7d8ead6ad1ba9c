"""Where code runs: under a rank-0 check, under a CUDA-availability check, inside which loop.

"Guarded by rank 0" is read from the tests of enclosing ``if`` statements (``rank == 0``,
``is_main``, ``dist.get_rank() == 0``, ``run.is_main`` ...), early exits (``if rank != 0:
return``), rank-zero decorators, and functions whose every call site is itself guarded.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import replace

from splitsync.check.facts import SCOPES, Facts, last_name
from splitsync.check.ranks import constant_in, ident, is_rank_like, mentions_rank

__all__ = ["is_rank_like", "rank0_test", "nonmain_test", "guarded_by_rank0", "with_rank0_functions",
           "ends_in_exit", "loops_of", "conditional_between", "mentions_rank"]

_MAIN_FLAG = re.compile(
    r"^(is_)?(main|master|chief|leader|primary)(_process|_proc|_rank|_worker|_node)?$"
    r"|rank_?0|rank_zero|global_zero|^is_local_(main|master)", re.IGNORECASE)
_RANK0_DECORATOR = re.compile(r"rank_?zero|rank_?0|main_process|master_only|main_only", re.I)
_EXITS = frozenset({"exit", "_exit", "quit"})


def _is_zero(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and expr.value == 0 and not isinstance(expr.value, bool)


def _main_flag(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Name | ast.Attribute | ast.Call) and bool(
        _MAIN_FLAG.search(ident(expr)))


def _none(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is None


def _flag(expr: ast.AST, flags: frozenset[str]) -> bool:
    return isinstance(expr, ast.Name | ast.Attribute) and last_name(expr) in flags


def _compare(test: ast.Compare) -> tuple[ast.AST, ast.cmpop, ast.AST] | None:
    if len(test.ops) != 1:
        return None
    return test.left, test.ops[0], test.comparators[0]


def rank0_test(test: ast.AST, flags: frozenset[str] = frozenset()) -> bool:
    """Is ``test`` true only on rank 0 (``rank == 0``, ``is_main``, ``not rank`` ...)?
    ``flags`` are names assigned from such a test (``should_log = is_main_process()``)."""
    if isinstance(test, ast.BoolOp):
        return any(rank0_test(v, flags) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        operand = test.operand
        if (isinstance(operand, ast.Name | ast.Attribute) and last_name(operand) in flags) \
                or _main_flag(operand):
            return False  # `not is_rank0`: a flag of rank 0, negated (every rank but 0)
        return is_rank_like(operand) or nonmain_test(operand, flags)
    if isinstance(test, ast.Name | ast.Attribute) and last_name(test) in flags:
        return True
    if isinstance(test, ast.Compare) and (parts := _compare(test)):
        left, op, right = parts
        if isinstance(op, ast.IsNot) and _none(right) and _flag(left, flags):
            return True  # `writer is not None`, writer made on rank 0 only
        if isinstance(op, ast.Eq | ast.Is | ast.LtE):
            return (is_rank_like(left) and _is_zero(right)) or (_is_zero(left) and is_rank_like(right))
        if isinstance(op, ast.Lt):
            return is_rank_like(left) and isinstance(right, ast.Constant) and right.value == 1
        if isinstance(op, ast.In) and isinstance(right, ast.List | ast.Tuple | ast.Set):
            return is_rank_like(left) and any(_is_zero(e) for e in right.elts)
        return False
    return _main_flag(test)


def nonmain_test(test: ast.AST, flags: frozenset[str] = frozenset()) -> bool:
    """Is ``test`` true on every rank but 0 (``rank != 0``, ``not is_main``, ``rank > 0`` ...)?"""
    if isinstance(test, ast.BoolOp):
        pick = any if isinstance(test.op, ast.Or) else all
        return pick(nonmain_test(v, flags) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return rank0_test(test.operand, flags)
    if isinstance(test, ast.Compare) and (parts := _compare(test)):
        left, op, right = parts
        if isinstance(op, ast.Is) and _none(right) and _flag(left, flags):
            return True  # `writer is None`, writer made on rank 0 only
        if isinstance(op, ast.NotEq | ast.IsNot | ast.Gt):
            return is_rank_like(left) and _is_zero(right)
        if isinstance(op, ast.NotIn) and isinstance(right, ast.List | ast.Tuple | ast.Set):
            return is_rank_like(left) and any(_is_zero(e) for e in right.elts)  # not in [-1, 0]
        return False
    return is_rank_like(test) and not _main_flag(test)


def ends_in_exit(block: list[ast.stmt]) -> bool:
    end = block[-1] if block else None
    if isinstance(end, ast.Return | ast.Continue | ast.Break | ast.Raise):
        return True
    return isinstance(end, ast.Expr) and last_name(end.value) in _EXITS


def _early_exit_before(block: list[ast.stmt], child: ast.AST, flags: frozenset[str]) -> bool:
    for stmt in block:
        if stmt is child:
            return False
        if isinstance(stmt, ast.If) and nonmain_test(stmt.test, flags) and ends_in_exit(stmt.body):
            return True
    return False


def _guarding_parent(parent: ast.AST, child: ast.AST, flags: frozenset[str]) -> bool:
    if isinstance(parent, ast.If | ast.IfExp | ast.While):
        body = parent.body if isinstance(parent.body, list) else [parent.body]
        orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
        if any(child is s for s in body) and rank0_test(parent.test, flags):
            return True
        if any(child is s for s in orelse) and nonmain_test(parent.test, flags):
            return True
    if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And):
        before = parent.values[:[id(v) for v in parent.values].index(id(child))]
        if any(rank0_test(v, flags) for v in before):
            return True
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and any(child is s for s in block):
            if _early_exit_before(block, child, flags):
                return True
    return False


def guarded_by_rank0(facts: Facts, node: ast.AST) -> bool:
    """Does ``node`` run on rank 0 only?"""
    child = node
    for parent in facts.ancestors(node):
        if _guarding_parent(parent, child, facts.rank0_flags):
            return True
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
            if any(_RANK0_DECORATOR.search(ast.unparse(d)) for d in parent.decorator_list):
                return True
            return parent.name in facts.rank0_functions
        if isinstance(parent, SCOPES):
            return False
        child = parent
    return False


def _call_sites(facts: Facts) -> dict[str, tuple[list[ast.Call], int]]:
    """Per function or method name: its call sites (``name(...)``, ``self.name(...)``) and
    how many times the name is mentioned at all, from one pass over the tree (kept: it
    depends on the tree alone). The lists are shared: read them, never change them."""
    memo = facts.tree_index.memo
    if "call_sites" in memo:
        return memo["call_sites"]  # type: ignore[return-value]
    names = {n.name for n in facts.of(ast.FunctionDef, ast.AsyncFunctionDef)}  # type: ignore[attr-defined]
    sites: dict[str, list[ast.Call]] = {name: [] for name in names}
    mentions: dict[str, int] = dict.fromkeys(names, 0)
    for n in facts.of(ast.Name, ast.Attribute) if names else ():
        name = None
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            name = n.id
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                and n.value.id in {"self", "cls"}:
            name = n.attr
        if name in mentions:
            mentions[name] += 1
            parent = facts.parents.get(n)
            if isinstance(parent, ast.Call) and parent.func is n:
                sites[name].append(parent)
    found = memo["call_sites"] = {name: (sites[name], mentions[name]) for name in names}
    return found


def rank0_flags(facts: Facts) -> frozenset[str]:
    """Names assigned only from rank-0 tests: ``should_log = accelerator.is_main_process``,
    ``self.can_checkpoint = self.is_local_main if local else self.is_main`` (kept with the
    tree: the call graph and the rules ask)."""
    memo = facts.tree_index.memo
    if "rank0_flags" not in memo:
        memo["rank0_flags"] = _rank0_flags(facts)
    return memo["rank0_flags"]  # type: ignore[return-value]


def _rank0_flags(facts: Facts) -> frozenset[str]:
    flags: frozenset[str] = frozenset()
    assigns = facts.of(ast.Assign)
    for _ in range(2):  # a flag computed from a flag
        found = set(flags)
        for node in assigns:
            value = node.value
            branches = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
            if all(rank0_test(b, flags) for b in branches):
                found.update(n for t in node.targets if (n := last_name(t)))
        if found == flags:
            break
        flags = frozenset(found)
    return flags | _rank0_objects(facts, assigns, flags)


def _rank0_objects(facts: Facts, assigns: list[ast.AST], flags: frozenset[str]) -> frozenset[str]:
    """Names set to ``None`` and to something else only under a rank-0 test (``writer =
    None``, ``if rank == 0: writer = SummaryWriter()``): ``if writer is not None:`` is a
    rank-0 test too (open_clip's ``remote_sync_process``)."""
    def names(node: ast.AST) -> list[str]:
        return [n for t in node.targets  # type: ignore[attr-defined]
                if isinstance(t, ast.Name | ast.Attribute) and (n := last_name(t))]

    empty = [n for node in assigns if _none(node.value)  # type: ignore[attr-defined]
             for n in names(node)]
    if not empty:
        return frozenset()
    kinds: dict[str, set[str]] = {n: {"none"} for n in empty}
    for node in assigns:
        if _none(node.value):  # type: ignore[attr-defined]
            continue
        hit = [n for n in names(node) if n in kinds]
        if hit:
            kind = "rank0" if _under_rank0(facts, node, flags) else "other"
            for n in hit:
                kinds[n].add(kind)
    return frozenset(n for n, k in kinds.items() if k == {"none", "rank0"})


def _under_rank0(facts: Facts, node: ast.AST, flags: frozenset[str]) -> bool:
    """Is ``node`` in the body of a rank-0 test of its own function?"""
    child = node
    for parent in facts.ancestors(node):
        if isinstance(parent, ast.If) and any(child is s for s in parent.body) \
                and rank0_test(parent.test, flags):
            return True
        if isinstance(parent, SCOPES):
            return False
        child = parent
    return False


def with_rank0_functions(facts: Facts) -> Facts:
    """Add the functions and methods that only ever run on rank 0 (every call site guarded)."""
    if not facts.in_distributed_run:
        return facts  # only rules about distributed scripts ask
    facts = replace(facts, rank0_flags=rank0_flags(facts))
    uses = _call_sites(facts)
    for _ in range(4):  # a few rounds reach helpers called from guarded helpers
        found = {name for name, (sites, mentions) in uses.items()
                 if sites and mentions == len(sites)
                 and all(guarded_by_rank0(facts, c) for c in sites)}
        if found == facts.rank0_functions:
            break
        facts = replace(facts, rank0_functions=frozenset(found))
    return facts


def loops_of(facts: Facts, node: ast.AST) -> Iterator[ast.For | ast.While | ast.AsyncFor]:
    """Enclosing loops of ``node`` in its own scope, nearest first."""
    for parent in facts.ancestors(node):
        if isinstance(parent, SCOPES):
            return
        if isinstance(parent, ast.For | ast.While | ast.AsyncFor):
            yield parent


def conditional_between(facts: Facts, node: ast.AST, loop: ast.AST) -> bool:
    """Is ``node`` under an ``if`` inside ``loop`` (so it need not run every iteration)?

    Rank-0 checks do not count: the guarded code still runs every step on rank 0.
    """
    child = node
    for parent in facts.ancestors(node):
        if parent is loop:
            return False
        if isinstance(parent, ast.If | ast.IfExp) and child is not parent.test:
            if not rank0_test(parent.test) or _also_interval(parent.test):
                return True
        child = parent
    return False


def _also_interval(test: ast.AST) -> bool:
    """``master_process and step % log_every == 0``: a rank-0 test that also holds only every
    few steps (any other condition joined with ``and``)."""
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and any(
        not rank0_test(v) for v in test.values)


def _guard_of(parent: ast.AST, child: ast.AST, flags: frozenset[str]) -> ast.AST | None:
    """The test that makes ``child`` rank-0-only under ``parent``, if one does."""
    if isinstance(parent, ast.If | ast.IfExp | ast.While):
        body = parent.body if isinstance(parent.body, list) else [parent.body]
        orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
        if any(child is s for s in body) and rank0_test(parent.test, flags):
            return parent.test
        if any(child is s for s in orelse) and nonmain_test(parent.test, flags):
            return parent.test
    if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And):
        before = parent.values[:[id(v) for v in parent.values].index(id(child))]
        return next((v for v in before if rank0_test(v, flags)), None)
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and any(child is s for s in block):
            for stmt in block:
                if stmt is child:
                    break
                if isinstance(stmt, ast.If) and nonmain_test(stmt.test, flags) \
                        and ends_in_exit(stmt.body):
                    return stmt.test
    return None


def rank0_guards(facts: Facts, node: ast.AST, depth: int = 0) -> list[ast.AST]:
    """The tests that make ``node`` run on rank 0 only (through the call sites of a helper
    that only guarded code calls); empty when it is not guarded."""
    child = node
    for parent in facts.ancestors(node):
        test = _guard_of(parent, child, facts.rank0_flags)
        if test is not None:
            return [test]
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
            if parent.name not in facts.rank0_functions or depth > 3:
                return []
            found: list[ast.AST] = []
            for site in _call_sites(facts).get(parent.name, ([], 0))[0]:
                found += rank0_guards(facts, site, depth + 1)
            return found
        if isinstance(parent, SCOPES):
            return []
        child = parent
    return []


def local_rank_names(facts: Facts) -> set[str]:
    """Names (``gpu_id``, ``self.gpu_id``) assigned from the launcher's ``LOCAL_RANK``."""
    names: set[str] = set()
    for node in facts.of(ast.Assign):
        if constant_in(facts, node.value, "LOCAL_RANK"):  # type: ignore[attr-defined]
            names.update(n for t in node.targets if (n := last_name(t)))  # type: ignore[attr-defined]
    return names


def is_local_rank_test(test: ast.AST, local_names: set[str]) -> bool:
    """Is ``test`` about the rank within one machine (``local_rank == 0``)?"""
    for n in ast.walk(test):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and is_rank_like(n.left):
            return True  # `rank % ngpus_per_node == 0`: the first process of every node
        ident = last_name(n) if isinstance(n, ast.Name | ast.Attribute) else None
        if ident and ("local" in ident.lower() or ident in local_names):
            return True
        if isinstance(n, ast.Constant) and n.value == "LOCAL_RANK":
            return True
    return False
