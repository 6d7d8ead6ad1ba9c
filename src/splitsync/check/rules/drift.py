"""Replicas that drift apart: an optimizer or learning-rate scheduler stepped on some ranks
only (SS209).

DDP keeps the replicas identical by giving every rank the same averaged gradients and
trusting every rank to apply them the same way. An ``optimizer.step()`` under ``if rank ==
0:`` updates one replica; a ``scheduler.step()`` under a test of the node's rank (SimCLR's
``if args.nr == 0 and scheduler:``) leaves the other nodes at the initial learning rate.
Nothing fails: the replicas silently train different models.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.facts import Facts, last_name
from splitsync.check.flow import nonmain_test, rank0_test
from splitsync.check.model import Hit, Rule
from splitsync.check.ranks import ident, rank_in

__all__ = ["RULES"]

#: Receivers of `.step()` that update the model's weights or learning rate.
_UPDATERS = re.compile(r"(^|_)(optim|optimizer|opt|sched|scheduler|lr_scheduler)(_|\d|$)|"
                       r"optimizer|scheduler", re.I)
#: Names of a node's rank in multi-node scripts (`args.nr`): a test of it is per node.
_NODE_RANK = frozenset({"nr", "node_rank", "node_id", "node_idx", "machine_rank"})


def _updater(facts: Facts, call: ast.Call) -> str | None:
    """``optimizer.step()``, ``scheduler.step()``, ``scaler.step(optimizer)``: what it updates."""
    receiver = call.func.value  # type: ignore[attr-defined]
    name = last_name(receiver) or ""
    if _UPDATERS.search(name):
        return facts.text(receiver, 40)
    if "scaler" in name.lower() and call.args and _UPDATERS.search(last_name(call.args[0]) or ""):
        return facts.text(call.args[0], 40)
    return None


def _per_rank_test(facts: Facts, test: ast.AST) -> bool:
    """A test whose value differs between ranks: the rank, the local or the node's rank."""
    if rank0_test(test, facts.rank0_flags) or nonmain_test(test, facts.rank0_flags):
        return True
    return rank_in(facts, test) or any(
        isinstance(n, ast.Name | ast.Attribute) and ident(n) in _NODE_RANK for n in ast.walk(test))


def _rank_guard(facts: Facts, call: ast.AST) -> ast.AST | None:
    """The per-rank ``if`` test the call sits under, in its own function."""
    child = call
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.If) and child is not parent.test \
                and _per_rank_test(facts, parent.test):
            return parent.test
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            return None
        child = parent
    return None


def update_on_some_ranks(facts: Facts) -> Iterator[Hit]:
    """SS209: an optimizer or LR scheduler stepped under a per-rank test in a DDP project."""
    if not facts.in_distributed_run or not facts.project.wrapped:
        return
    for call in facts.method_calls("step"):
        what = _updater(facts, call)
        test = _rank_guard(facts, call) if what else None
        if test is None:
            continue
        yield Hit(call, f"`{facts.text(call, 60)}` runs only where `{facts.text(test, 60)}` "
                  f"holds, a test whose value differs between processes: the other ranks "
                  f"never step `{what}`, so their weights or learning rate fall behind and "
                  "the replicas train different models (nothing fails).",
                  "step on every rank, outside the rank test (keep only the logging, "
                  "printing or saving under it); DDP already gives every rank the same "
                  "gradients.")


RULES = (
    Rule("SS209", "update-on-some-ranks", "error",
         "an optimizer or learning-rate scheduler stepped under a rank test (the replicas "
         "drift apart)",
         "Under DDP every rank must apply the averaged gradients the same way. An "
         "`optimizer.step()` or `scheduler.step()` under `if rank == 0:`, a local-rank test or "
         "a node-rank test (`if args.nr == 0:`) updates some replicas only: the others keep "
         "their weights or their learning rate, and the ranks silently train different "
         "models. Known false positives: an optimizer of a model that only rank 0 trains "
         "(a probe evaluated on rank 0), stepped under the rank test.",
         update_on_some_ranks),
)
