"""Which expressions name a process's rank, and which parts of a file mention one.

Many rules ask whether an expression mentions the rank anywhere inside it (``seed + rank``,
``data[rank::world]``, ``f"cuda:{local_rank}"``). Each file's rank-like expressions are found
once, and every node above one is marked, so the question costs a set lookup instead of a
walk of the expression.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from splitsync.check.facts import Facts, last_name

__all__ = ["is_rank_like", "mentions_rank", "rank_in", "constant_in", "ident"]

#: Names scripts use for the local rank when it doubles as the GPU index (PyTorch's tutorials).
_LOCAL_IDS = frozenset({"gpu_id", "gpu", "device_id", "local_gpu"})


def ident(expr: ast.AST) -> str:
    """The last identifier of ``expr``, lower case (empty when it has none)."""
    name = last_name(expr)
    return name.lower() if name else ""


def _strip_cast(expr: ast.AST) -> ast.AST:
    while (isinstance(expr, ast.Call) and last_name(expr) in {"int", "str", "bool"}
           and expr.args):
        expr = expr.args[0]
    return expr


def is_rank_like(expr: ast.AST) -> bool:
    """``rank``, ``args.local_rank``, ``dist.get_rank()``, ``int(os.environ["RANK"])`` ..."""
    expr = _strip_cast(expr)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
        return is_rank_like(expr.left)  # `rank % gpus_per_node`: the local rank
    if isinstance(expr, ast.Subscript):
        key = expr.slice
        return isinstance(key, ast.Constant) and "RANK" in str(key.value).upper()
    if isinstance(expr, ast.Call):
        if "rank" in ident(expr):
            return True
        return any(isinstance(a, ast.Constant) and "RANK" in str(a.value).upper()
                   for a in expr.args)
    name = ident(expr)
    return isinstance(expr, ast.Name | ast.Attribute) and ("rank" in name or name in _LOCAL_IDS)


def _call_rank_like(call: ast.Call) -> bool:
    """``is_rank_like(call)``, without its overhead for the common call that casts nothing."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(
        func, ast.Name) else None
    if name in {"int", "str", "bool"} and call.args:
        return is_rank_like(call)  # a cast: what it casts decides
    if name is not None and "rank" in name.lower():
        return True
    return any(isinstance(a, ast.Constant) and "RANK" in str(a.value).upper() for a in call.args)


def _marked(facts: Facts, found: Iterable[ast.AST]) -> frozenset[ast.AST]:
    """``found`` and every node above one of them: the nodes whose subtree holds one."""
    parents = facts.parents
    marked: set[ast.AST] = set()
    for node in found:
        while node is not None and node not in marked:
            marked.add(node)
            node = parents.get(node)  # type: ignore[assignment]
    return frozenset(marked)


def _rank_marked(facts: Facts) -> frozenset[ast.AST]:
    index = facts.tree_index
    marked = index.memo.get("rank")
    if marked is None:
        # only names, attributes, subscripts, calls and `%` can be rank-like; a name or an
        # attribute is, by its identifier alone (is_rank_like, without the call overhead)
        found: list[ast.AST] = [
            n for n in index.of(ast.Name)
            if "rank" in (i := n.id.lower()) or i in _LOCAL_IDS]  # type: ignore[attr-defined]
        found += [n for n in index.of(ast.Attribute)
                  if "rank" in (i := n.attr.lower()) or i in _LOCAL_IDS]  # type: ignore[attr-defined]
        found += [n for n in index.of(ast.Subscript)
                  if isinstance(key := n.slice, ast.Constant)  # type: ignore[attr-defined]
                  and "RANK" in str(key.value).upper()]
        found += [n for n in index.of(ast.BinOp) if isinstance(n.op, ast.Mod)  # type: ignore[attr-defined]
                  and is_rank_like(n)]
        found += [n for n in index.of(ast.Call) if _call_rank_like(n)]  # type: ignore[arg-type]
        marked = index.memo["rank"] = _marked(facts, found)
    return marked  # type: ignore[return-value]


def rank_in(facts: Facts, node: ast.AST | None) -> bool:
    """Does ``node`` (an expression of ``facts``'s tree) hold a rank-like expression anywhere,
    itself included: ``any(is_rank_like(n) for n in ast.walk(node))``?"""
    if node is None:
        return False
    if not facts.tree_index.owns(node):
        return any(is_rank_like(n) for n in ast.walk(node))
    return node in _rank_marked(facts)


def constant_in(facts: Facts, node: ast.AST, value: str) -> bool:
    """Does ``node`` hold the string constant ``value`` anywhere (``"LOCAL_RANK"``)?"""
    if not facts.tree_index.owns(node):
        return any(isinstance(n, ast.Constant) and n.value == value for n in ast.walk(node))
    index = facts.tree_index
    key = f"constant:{value}"
    marked = index.memo.get(key)
    if marked is None:
        marked = index.memo[key] = _marked(facts, (
            n for n in index.of(ast.Constant) if n.value == value))  # type: ignore[attr-defined]
    return node in marked  # type: ignore[operator]


def mentions_rank(nodes: list[ast.AST], facts: Facts | None = None) -> bool:
    """Does any of ``nodes`` mention a rank (so the line is deliberately per rank)?
    ``facts``: the file the nodes belong to, to answer from its index."""
    if facts is not None:
        return any(rank_in(facts, n) for n in nodes)
    return any(is_rank_like(n) for root in nodes for n in ast.walk(root))
