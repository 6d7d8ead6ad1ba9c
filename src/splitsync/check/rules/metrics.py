"""Evaluation metrics reported from one rank's shard without a reduction (SS506).

A DistributedSampler hands each rank 1/N of the validation set. Accuracy or loss summed over
that shard and printed, logged or returned without an all-reduce is one rank's number, not
the model's: it changes with the world size and differs between ranks (so does "best
checkpoint" selection based on it).

Evidence required, all in the script's own code:
- the loop iterates a loader built with a distributed sampler (directly, through a name, a
  helper that makes one, ``run.loader``), or a parameter that every call site fills so;
- the loop is evaluation (``torch.no_grad()``/``inference_mode()``, ``model.eval()``, or a
  function named for validation or testing) and accumulates a value (``+=``, ``.update(``,
  ``.append(``) that the function then reports (prints, logs, returns);
- nothing in that function, what it calls, or where its result goes, reduces or gathers.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.facts import SCOPES, Facts, last_name
from splitsync.check.flow import rank0_guards
from splitsync.check.loaders import accumulated, is_eval, iterated, sharded_loaders
from splitsync.check.model import Hit, Rule

__all__ = ["RULES", "unreduced_eval_metric"]

#: A call whose name says it communicates between ranks (or a metrics library that does);
#: not a context that skips a sync (`no_sync`, Fabric's `no_backward_sync`).
_REDUCING = re.compile(r"reduce|gather|(?<!no_)(?<!backward_)sync|all_?avg|all_?mean|broadcast",
                       re.I)
#: ``compute()`` of a metrics library syncs across ranks; ``cuda.synchronize()`` does not.
_REDUCING_EXACT = frozenset({"compute"})
_NOT_REDUCING = frozenset({"synchronize"})
_REPORTS = frozenset({"print", "info", "log", "log_dict", "log_metrics", "add_scalar",
                      "add_scalars", "write", "warning", "debug", "set_postfix", "log_scalar",
                      "log_metric", "echo", "dump"})
_RUN_COLLECTIVES = frozenset({"sum", "mean", "max", "gather", "gather_for_metrics"})




















def _function_of(facts: Facts, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    scope = facts.scope(node)
    return scope if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) else None


def _filled_with_sharded(facts: Facts, fn: ast.FunctionDef | ast.AsyncFunctionDef, param: str,
                         loaders: set[str]) -> bool:
    """Does every call of ``fn`` in the script pass a sharded loader as ``param``?"""
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if param not in names:
        return False
    index = names.index(param) - (1 if names and names[0] in ("self", "cls") else 0)
    passed: list[ast.AST] = []
    for call, _ in facts.calls:
        if last_name(call) != fn.name:
            continue
        keyword = next((k.value for k in call.keywords if k.arg == param), None)
        if keyword is not None:
            passed.append(keyword)
        elif 0 <= index < len(call.args):
            passed.append(call.args[index])
    return bool(passed) and all(iterated(p) in loaders for p in passed)






def _reports(fn: ast.AST, loop: ast.AST, names: set[str]) -> ast.AST | None:
    """The first statement after the loop that prints, logs or returns an accumulated value
    (or one computed from it after the loop: ``out = losses.mean(); return out``)."""
    accumulated, names = set(names), set(names)
    derived: dict[str, ast.Assign] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and node.lineno > loop.end_lineno and any(  # type: ignore[operator]
                isinstance(n, ast.Name) and n.id in names for n in ast.walk(node.value)):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id not in names:
                    names.add(t.id)
                    derived[t.id] = node
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call | ast.Return) or node.lineno <= loop.end_lineno:  # type: ignore[operator]
            continue
        if isinstance(node, ast.Call) and last_name(node) not in _REPORTS:
            continue
        if isinstance(node, ast.Return) and node.value is None:
            continue
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if used & accumulated:
            return node
        if used & names:  # `return out` of `out = losses.mean()`: where the mean is taken
            return derived[min(used & names, key=lambda n: derived[n].lineno)]
    return None


def _counts(value: ast.AST) -> bool:
    """An increment that counts (``+= 1``, ``+= len(x)``, ``+= x.size(0)``), not a measure."""
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute):
        return value.value.attr == "shape"
    return isinstance(value, ast.Call) and last_name(value) in {"len", "size", "numel"}


def _measured(loop: ast.For | ast.AsyncFor, names: set[str]) -> set[str]:
    """Of ``names``, those the loop adds a measured value to (``total_loss += loss.item()``,
    ``losses.append(loss)``), not a counter (``step += 1``)."""
    found: set[str] = set()
    for node in ast.walk(loop):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) \
                and node.target.id in names and not _counts(node.value):
            found.add(node.target.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in names \
                and node.func.attr in ("append", "update") and node.args \
                and not all(_counts(a) for a in node.args):
            found.add(node.func.value.id)
    return found


def _rank0_report(facts: Facts, fn: ast.AST, loop: ast.AST, report: ast.AST,
                  names: set[str]) -> bool:
    """Is ``report`` a print or log on rank 0 only, guarded inside ``fn`` itself, of a value
    nothing re-binds between the loop and it?"""
    if not isinstance(report, ast.Call):
        return False
    guards = rank0_guards(facts, report)
    if not guards or not all(any(a is fn for a in facts.ancestors(g)) for g in guards):
        return False
    used = {n.id for n in ast.walk(report) if isinstance(n, ast.Name)} & names
    return bool(used) and not any(
        isinstance(n, ast.Assign | ast.AugAssign) and loop.end_lineno < n.lineno < report.lineno  # type: ignore[operator]
        and any(isinstance(t, ast.Name) and t.id in used
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
        for n in ast.walk(fn))


def _reducing_call(facts: Facts, call: ast.Call) -> bool:
    name = last_name(call) or ""
    if name in _REDUCING_EXACT or (_REDUCING.search(name) and name not in _NOT_REDUCING):
        return True
    # splitsync's collectives: run.sum(t), run.mean(t), run.max(t)
    return isinstance(call.func, ast.Attribute) and facts.is_run(call.func.value) and \
        call.func.attr in _RUN_COLLECTIVES


def _reduces(facts: Facts, fn: ast.FunctionDef | ast.AsyncFunctionDef, depth: int = 0) -> bool:
    """Does ``fn`` (or a function of the script it calls) reduce or gather across ranks?"""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        name = last_name(node) or ""
        if _reducing_call(facts, node):
            return True
        callee = facts.functions.get(name)
        if callee is not None and callee is not fn and depth < 2 and _reduces(
                facts, callee, depth + 1):
            return True
    return False


def _result_reduced(facts: Facts, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Is ``fn``'s result reduced where it is called (``acc = reduce_mean(validate(...))``)?"""
    for call, _ in facts.calls:
        if last_name(call) != fn.name:
            continue
        scope = facts.scope(call)
        if any(isinstance(p, ast.Call) and _reducing_call(facts, p)
               for p in facts.ancestors(call) if not isinstance(p, SCOPES)):
            return True
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) and _reduces(facts, scope, 2):
            return True
        if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                _reducing_call(facts, c) for c, _ in facts.calls if facts.scope(c) is scope):
            return True
    return False


def unreduced_eval_metric(facts: Facts) -> Iterator[Hit]:
    """SS506: an evaluation metric from one rank's shard, reported without a reduction."""
    if not facts.in_distributed_run:
        return
    loaders = sharded_loaders(facts)
    if not loaders:
        return
    for node in facts.of(ast.For, ast.AsyncFor):
        if not isinstance(node, ast.For | ast.AsyncFor):
            continue
        name = iterated(node.iter)
        fn = _function_of(facts, node)
        if name is None or fn is None:
            continue
        if name not in loaders and not _filled_with_sharded(facts, fn, name, loaders):
            continue
        evaluating = is_eval(facts, node, fn)
        sums = accumulated(node) if evaluating else _measured(node, accumulated(node))
        report = _reports(fn, node, sums) if sums else None
        if report is None or (not evaluating and not _rank0_report(facts, fn, node, report, sums)):
            continue  # beyond evaluation: only a rank-0 report of a measured sum, seen here
        if _reduces(facts, fn) or _result_reduced(facts, fn):
            continue
        if not evaluating:
            yield Hit(report, f"{fn.name}() reports `{facts.text(report)}` on rank 0 only, from "
                      f"values summed over `{name}`, which is sharded between the ranks: rank 0 "
                      "saw 1/world_size of the data, and nothing reduces the sums across ranks, "
                      "so the figure shown as the epoch's is rank 0's shard alone.",
                      "all-reduce the sums and counts before rank 0 reports them "
                      "(`dist.all_reduce(t)` on a tensor of [sum, count]; splitsync: "
                      "`run.mean(t)`), or say in the label that it is rank 0's shard.")
            continue
        if isinstance(report, ast.Return) and report.value is not None:
            what = f"returns `{facts.text(report.value)}`"
        else:
            what = f"reports `{facts.text(report)}`"
        yield Hit(report, f"{fn.name}() {what}, summed over "
                  f"`{name}`, which is sharded between the ranks (a DistributedSampler, or a "
                  "framework's prepared loader): each rank "
                  "sees 1/world_size of the data, and nothing reduces the result across "
                  "ranks, so the figure is one rank's shard (it changes with the number of "
                  "processes, and ranks disagree on it).",
                  "all-reduce the sums and counts before dividing (`dist.all_reduce(t)` on a "
                  "tensor of [correct, total]; splitsync: `run.sum(t)`), or "
                  "evaluate the whole set with a plain sampler on one rank.")


RULES = (
    Rule("SS506", "unreduced-eval-metric", "warning",
         "an evaluation metric computed on one rank's shard and reported without a reduction",
         "With a DistributedSampler on the validation loader every rank evaluates 1/N of the "
         "set. A metric summed over that shard and printed, logged or returned without "
         "dist.all_reduce (or a gather) describes one shard: it moves with the world size, "
         "and 'best checkpoint' choices made from it differ between ranks. Reported only "
         "with evidence: a loader built with a distributed sampler, an evaluation loop "
         "(no_grad, model.eval(), a validate/test function) that accumulates what is then "
         "reported, and no reduce, gather or metrics-library compute() in that function, "
         "the functions it calls, or where its result goes. Beyond evaluation (a training "
         "loop over a sharded loader), only a value the loop adds a measure to (not a "
         "counter) and then prints or logs on rank 0 only, both in one function. Known false "
         "positives: a "
         "reduction hidden in a class or module the checker does not read.",
         unreduced_eval_metric),
)
