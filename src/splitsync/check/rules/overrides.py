"""A ``print`` replacement that forgets the rank (SS508).

Many trainers silence ``print`` off rank 0 by replacing ``builtins.print`` (MAE's and DeiT's
``setup_for_distributed(is_master)``). The replacement still prints on every rank, or on one
process per machine, when:

- it lets every process print above a world size (MAE: ``force = force or
  (get_world_size() > 8)``);
- it tests the local rank (``if local_rank == 0 or force:``), or is handed one
  (``setup_for_distributed(args.gpu == 0)``): the first process of every node prints;
- it is installed only on one launch path (MoCo: ``if args.multiprocessing_distributed and
  args.gpu != 0:``): launched by torchrun, every rank prints.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.facts import Facts, last_name
from splitsync.check.flow import is_local_rank_test, local_rank_names
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

_BUILTINS = frozenset({"builtins", "__builtin__", "__builtins__"})
_WORLD = re.compile(r"world_size|num_tasks|world", re.I)
_FIX = ("decide on the global rank, once, for every launch path: `setup_for_distributed("
        "dist.get_rank() == 0)` after the process group exists (`int(os.environ[\"RANK\"]) == "
        "0` under torchrun); splitsync's `run.print` does this")


def _installs(facts: Facts) -> Iterator[tuple[ast.Assign, str | None]]:
    """``builtins.print = prt``: the assignment and the replacement's name."""
    for node in facts.of(ast.Assign):
        for target in node.targets:  # type: ignore[attr-defined]
            if isinstance(target, ast.Attribute) and target.attr == "print" \
                    and isinstance(target.value, ast.Name) and target.value.id in _BUILTINS:
                value = node.value  # type: ignore[attr-defined]
                yield node, value.id if isinstance(value, ast.Name) else None  # type: ignore[misc]


def _local(test: ast.AST, local: set[str]) -> bool:
    """A test on the local rank or the GPU index (``args.gpu != 0``, ``local_rank == 0``)."""
    return is_local_rank_test(test, local) or any(
        (last_name(n) or "").lower() in {"gpu", "gpu_id", "local_gpu"}
        for n in ast.walk(test) if isinstance(n, ast.Name | ast.Attribute))


def _world_size_test(expr: ast.AST) -> ast.Compare | None:
    for node in ast.walk(expr):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.Gt | ast.GtE) and any(
                _WORLD.search(last_name(n) or "") for n in ast.walk(node.left)
                if isinstance(n, ast.Name | ast.Attribute | ast.Call)):
            return node
    return None


def _replacement(facts: Facts, scope: ast.AST, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(scope):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def print_override_forgets_rank(facts: Facts) -> Iterator[Hit]:
    """SS508: a print replacement that prints per node, above a world size, or only on
    one launch path."""
    local = local_rank_names(facts)
    for install, name in _installs(facts):
        scope = facts.scope(install)
        for parent in facts.ancestors(install):
            if isinstance(parent, ast.If) and _local(parent.test, local):
                yield Hit(parent.test, f"`print` is replaced (line {install.lineno}) only where "
                          f"`{facts.text(parent.test, 80)}`: that tests the GPU index or the "
                          "local rank, and holds on one launch path only, so launched any other "
                          "way (torchrun) every rank prints, and on several nodes the first "
                          "process of each node prints.", f"{_FIX}.")
                break
            if parent is scope:
                break
        fn = _replacement(facts, scope, name) if name else None
        if fn is None:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and (test := _world_size_test(node.value)):
                yield Hit(node, f"`{facts.text(node, 80)}` in the print replacement "
                          f"`{fn.name}` lets every process print once "
                          f"`{facts.text(test, 60)}`: on a large job all output is repeated "
                          "by every rank.", "drop the world-size override; pass "
                          "`force=True` where a rank must report.")
            elif isinstance(node, ast.If) and _local(node.test, local):
                yield Hit(node.test, f"the print replacement `{fn.name}` prints where "
                          f"`{facts.text(node.test, 80)}`, a test of the local rank: the first "
                          "process of every node prints everything.", f"{_FIX}.")
        yield from _local_callers(facts, scope, fn, local)


def _local_callers(facts: Facts, scope: ast.AST, fn: ast.FunctionDef,
                   local: set[str]) -> Iterator[Hit]:
    """``setup_for_distributed(args.gpu == 0)``: the replacement tests a parameter of the
    function that installs it, and a caller passes a local-rank test."""
    if not isinstance(scope, ast.FunctionDef):
        return
    params = [a.arg for a in scope.args.args]
    tested = {n.id for t in ast.walk(fn) if isinstance(t, ast.If)
              for n in ast.walk(t.test) if isinstance(n, ast.Name)}
    for at, param in enumerate(params):
        if param not in tested:
            continue
        for call, _ in facts.calls:
            arg = call.args[at] if last_name(call) == scope.name and len(call.args) > at \
                else None
            if arg is not None and _local(arg, local):
                yield Hit(call, f"`{facts.text(call, 80)}` decides who prints from the local "
                          "rank: the first process of every node prints.", f"{_FIX}.")


RULES = (
    Rule("SS508", "print-override-forgets-rank", "info",
         "a builtins.print replacement that prints per node, above a world size, or on one "
         "launch path only",
         "Replacing builtins.print with a rank-0-only printer silences every module at once, "
         "but only if the test is the global rank on every launch path. A replacement that "
         "tests the local rank (or the GPU index) prints on the first process of every node; "
         "one forced on above a world size (MAE's `get_world_size() > 8`) prints on every "
         "rank of a large job; one installed only under `--multiprocessing-distributed` "
         "leaves torchrun launches printing on every rank. Known false positives: single-node "
         "jobs (the local rank is the global rank), and a local-rank test meant as one log "
         "per machine.", print_override_forgets_rank),
)
