"""A tensor moved with ``x.to(device)`` whose result is thrown away (SS103)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.lint.facts import Facts, dotted
from splitsync.lint.model import Hit, Rule
from splitsync.lint.rules.devices import FACTORIES

__all__ = ["RULES"]

_MOVES = frozenset({"to", "cuda", "cpu"})


def _names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _loader_names(facts: Facts) -> set[str]:
    makers = facts.torch_calls("DataLoader") + facts.run_calls("loader")
    names: set[str] = set()
    for call in makers:
        holder = facts.parents.get(call)
        if isinstance(holder, ast.Assign):
            names.update(d for t in holder.targets if (d := dotted(t)))
    return names


def _tensor_names(facts: Facts, scope: ast.AST, loaders: set[str]) -> set[str]:
    """Names in ``scope`` bound to tensors: factory results and batches from a loader."""
    found: set[str] = set()
    for node in facts.walk_scope(scope):
        if isinstance(node, ast.Assign):
            root = node.value
            while isinstance(root, ast.Call) and isinstance(root.func, ast.Attribute) \
                    and root.func.attr in _MOVES | {"float", "long", "half"}:
                root = root.func.value
            if isinstance(root, ast.Call) and facts.is_torch(root, *FACTORIES) \
                    and isinstance(root.func, ast.Attribute):
                found |= _names(node.targets[0]) if len(node.targets) == 1 else set()
        elif isinstance(node, ast.For | ast.AsyncFor):
            if any(dotted(n) in loaders for n in ast.walk(node.iter)):
                found |= _names(node.target)
    return found


def discarded_move(facts: Facts) -> Iterator[Hit]:
    """SS103: ``x.to(device)`` as a statement on a tensor: the moved copy is lost."""
    loaders = _loader_names(facts)
    scopes = [facts.tree, *(n for n in facts.nodes
                            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    for scope in scopes:
        tensors = _tensor_names(facts, scope, loaders)
        for node in facts.walk_scope(scope):
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
                continue
            func = node.value.func
            if not (isinstance(func, ast.Attribute) and func.attr in _MOVES
                    and isinstance(func.value, ast.Name) and func.value.id in tensors):
                continue
            name, call = func.value.id, facts.text(node.value, 200)
            yield Hit(node.value, f"`{call}` throws its result away: a tensor's `.{func.attr}()` "
                      f"returns a moved copy (only a module's moves in place), so `{name}` stays "
                      "where it was and the next forward raises \"Expected all tensors to be on "
                      "the same device\".", f"assign the copy: `{name} = {call}`.")


RULES = (
    Rule("SS103", "tensor-move-discarded", "error",
         "tensor.to(device) / .cuda() as a statement: the moved copy is discarded",
         "Module.to() moves parameters in place and returns self; Tensor.to() returns a new "
         "tensor. Writing `x.to(device)` on a tensor does nothing.", discarded_move),
)
