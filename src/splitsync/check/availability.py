"""Is CUDA code behind a test that a GPU exists? (SS101, SS104, SS204 and the device rules.)

A `.cuda()` under `if torch.cuda.is_available():`, after `if not torch.cuda.is_available():
return`, or under a `backend == "nccl"` test keeps a CPU path; a test that only picks which
GPU to use (`if args.gpu is not None:`) does not when its other branch is CUDA too or raises.
"""

from __future__ import annotations

import ast

from splitsync.check.facts import SCOPES, Facts
from splitsync.check.flow import ends_in_exit

__all__ = ["availability_guarded"]

_AVAILABILITY = ("cuda", "is_available", "gpu", "accelerator", "device_count", "mps", "xpu",
                 "nccl")
#: Words of a test about the GPU itself (not `dist.is_available()`, which is about the
#: distributed package): an early return on them leaves CUDA-only code behind.
_DEVICE_WORDS = ("cuda", "gpu", "accelerator", "device_count", "mps", "xpu")
#: Words of a test that asks whether a GPU exists (not which one to use: `args.gpu is None`).
_STRONG = ("is_available", "device_count", "nccl", "mps", "xpu")


def _availability_exit_before(block: list[ast.stmt], child: ast.AST) -> bool:
    """``if not torch.cuda.is_available(): return`` earlier in ``block``."""
    for stmt in block:
        if stmt is child:
            return False
        if isinstance(stmt, ast.If) and ends_in_exit(stmt.body) and any(
                word in ast.unparse(stmt.test).lower() for word in _DEVICE_WORDS):
            return True
    return False


def availability_guarded(facts: Facts, node: ast.AST) -> bool:
    """Is ``node`` under a test for CUDA/GPU availability (or the device's type, or a
    ``backend == "nccl"`` test), or after an early return when CUDA is missing?"""
    child = node
    for parent in facts.ancestors(node):
        for name in ("body", "orelse"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and any(child is s for s in block) \
                    and _availability_exit_before(block, child):
                return True
        if isinstance(parent, ast.If | ast.IfExp | ast.While) and child is not parent.test:
            text = ast.unparse(parent.test).lower()
            if any(word in text for word in _AVAILABILITY) and not (
                    isinstance(parent, ast.If) and not _strong(facts, parent.test, text)
                    and _no_cpu_alternative(parent.orelse if child in parent.body
                                            else parent.body)):
                return True
        if isinstance(parent, ast.BoolOp) and child is not parent.values[0]:
            if any(w in ast.unparse(parent.values[0]).lower() for w in _AVAILABILITY):
                return True
        if isinstance(parent, SCOPES):
            return False
        child = parent
    return False


def _strong(facts: Facts, test: ast.AST, text: str) -> bool:
    """Does ``test`` ask whether a GPU exists: in words (``torch.cuda.is_available()``), or
    through a name bound to such a call (``num_gpus = torch.cuda.device_count()``, then
    ``if num_gpus >= 2:``)?"""
    if any(w in text for w in _STRONG):
        return True
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    return bool(names) and any(
        isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names
                                          for t in a.targets)
        and any(w in ast.unparse(a.value) for w in _STRONG)
        for a in facts.of(ast.Assign))


def _no_cpu_alternative(block: list[ast.stmt]) -> bool:
    """Is the other branch of a GPU-choice test CUDA too, or an error? MoCo's `if args.gpu is
    not None: model.cuda(args.gpu) ... else: model.cuda()` picks a GPU, it does not test for
    one, and `else: raise NotImplementedError(...)` leaves no CPU path either."""
    if not block:
        return False
    if isinstance(block[-1], ast.Raise):
        return True
    for stmt in block:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Attribute) and n.attr in {"cuda", "set_device"}:
                return True
            if isinstance(n, ast.Constant) and isinstance(n.value, str) \
                    and n.value.lower().startswith("cuda"):
                return True
    return False
