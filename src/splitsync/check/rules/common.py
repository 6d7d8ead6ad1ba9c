"""Helpers more than one rule module reads: the torch functions that create a tensor, a CUDA
device named by a literal, and a module-level default a configuration file overrides."""

from __future__ import annotations

import ast

from splitsync.check.facts import Facts, last_name

__all__ = ["FACTORIES", "cuda_literal", "overridable_default"]


#: torch functions that create a tensor (on the CPU unless given `device=`).
FACTORIES = frozenset({"randn", "rand", "zeros", "ones", "tensor", "arange", "randint", "empty",
                        "full", "linspace", "eye", "as_tensor", "from_numpy", "randperm",
                        "normal", "randn_like"})



def cuda_literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value.lower().startswith("cuda") else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) \
            and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) \
            and node.left.value.lower().startswith("cuda"):
        return ast.unparse(node)  # "cuda:%d" % rank
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
        if isinstance(head, ast.Constant) and str(head.value).lower().startswith("cuda"):
            return ast.unparse(node)
    return None



def overridable_default(facts: Facts, where: ast.AST) -> bool:
    """A module-level default the command line replaces: nanoGPT's ``device = 'cuda'`` followed
    by ``exec(open('configurator.py').read())``."""
    if not isinstance(where, ast.Assign) or where not in facts.tree.body:
        return False
    later = facts.tree.body[facts.tree.body.index(where) + 1:]
    return any(isinstance(n, ast.Call) and last_name(n) == "exec"
               for stmt in later for n in ast.walk(stmt))
