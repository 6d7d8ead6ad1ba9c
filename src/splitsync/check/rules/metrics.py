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
from splitsync.check.model import Hit, Rule

__all__ = ["RULES", "unreduced_eval_metric"]

_EVAL_NAME = re.compile(r"val|eval|test|score|metric|accura", re.I)
_TRAIN_NAME = re.compile(r"train", re.I)
#: A call whose name says it communicates between ranks (or a metrics library that does);
#: not a context that skips a sync (`no_sync`, Fabric's `no_backward_sync`).
_REDUCING = re.compile(r"reduce|gather|(?<!no_)(?<!backward_)sync|all_?avg|all_?mean|broadcast",
                       re.I)
#: Framework calls that shard the loaders they return (Fabric, Accelerate).
_FRAMEWORK_LOADERS = frozenset({"setup_dataloaders", "prepare"})
#: ``compute()`` of a metrics library syncs across ranks; ``cuda.synchronize()`` does not.
_REDUCING_EXACT = frozenset({"compute"})
_NOT_REDUCING = frozenset({"synchronize"})
_REPORTS = frozenset({"print", "info", "log", "log_dict", "log_metrics", "add_scalar",
                      "add_scalars", "write", "warning", "debug", "set_postfix", "log_scalar",
                      "log_metric", "echo", "dump"})
_RUN_COLLECTIVES = frozenset({"sum", "mean", "max", "gather", "gather_for_metrics"})
_NO_GRAD = frozenset({"no_grad", "inference_mode"})
_SAMPLERS = ("DistributedSampler", "DistributedEvalSampler", "ElasticDistributedSampler")


def _is_dist_sampler_call(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and (last_name(expr) or "").endswith(_SAMPLERS)


def _sampler_helpers(facts: Facts) -> set[str]:
    """Functions of the script that return a distributed sampler (``data_sampler(...)``)."""
    found = set()
    for name, fn in facts.functions.items():
        # the assignments and returns ast.walk(fn) would visit, from the tree index
        bound = {t.id for n in facts.inside(fn, ast.Assign) if isinstance(n, ast.Assign)
                 and _is_dist_sampler_call(n.value) for t in n.targets if isinstance(t, ast.Name)}
        if any(isinstance(n, ast.Return) and n.value is not None and (
                _is_dist_sampler_call(n.value)
                or (isinstance(n.value, ast.Name) and n.value.id in bound))
               for n in facts.inside(fn, ast.Return)):
            found.add(name)
    return found


def _makes_dist_sampler(expr: ast.AST, bound: set[str], helpers: set[str]) -> bool:
    if _is_dist_sampler_call(expr):
        return True
    if isinstance(expr, ast.Name):
        return expr.id in bound
    if isinstance(expr, ast.Call) and last_name(expr) in helpers:
        return True
    if isinstance(expr, ast.IfExp):  # DistributedSampler(ds) if args.distributed else None
        return _makes_dist_sampler(expr.body, bound, helpers)
    return False


def _target_names(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = []
    for t in targets:
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, ast.Attribute):
            names.append(t.attr)  # self.val_loader
    return names


def _returned(fn: ast.FunctionDef | ast.AsyncFunctionDef, loaders: set[str],
              facts: Facts | None = None) -> list[bool]:
    """Which positions of what ``fn`` returns are sharded loaders (``return train, val``)."""
    if facts is not None and not any(  # no return names a loader: nothing to walk for
            isinstance(n, ast.Return) and n.value is not None and _iterated(n.value) in loaders
            or isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
            for n in facts.inside(fn, ast.Return)):
        return []
    for node in ast.walk(fn):  # breadth first: the first such return decides
        if isinstance(node, ast.Return) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            flags = [_iterated(v) in loaders for v in values]
            if any(flags):
                return flags
    return []


def _sharded_loaders(facts: Facts) -> set[str]:
    """Names (or attributes) bound to a loader that a distributed sampler shards, also
    through a helper that builds and returns it (``train, val = prepare_dataset(...)``).
    Kept with the tree: SS304 and SS506 both ask."""
    memo = facts.tree_index.memo
    if "sharded_loaders" not in memo:
        memo["sharded_loaders"] = _find_sharded_loaders(facts)
    return memo["sharded_loaders"]  # type: ignore[return-value]


def _find_sharded_loaders(facts: Facts) -> set[str]:
    if not facts.named_calls(*_SAMPLERS, "DataLoader", "loader", *_FRAMEWORK_LOADERS):
        return set()  # no sampler, loader or framework call: no sharded loader to find
    helpers = _sampler_helpers(facts)
    samplers: set[str] = set()
    loaders: set[str] = set()
    makers: dict[str, list[bool]] = {}
    for _ in range(2):  # the second pass sees the helpers that return loaders
        for node in facts.of(ast.Assign, ast.AnnAssign):
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            value = node.value
            if _makes_dist_sampler(value, samplers, helpers):
                samplers.update(_target_names(node))
            elif isinstance(value, ast.Call):
                name = last_name(value) or ""
                sampler = next((k.value for k in value.keywords if k.arg == "sampler"), None)
                if name == "DataLoader" and sampler is not None and _makes_dist_sampler(
                        sampler, samplers, helpers):
                    loaders.update(_target_names(node))
                elif name == "loader" and isinstance(value.func, ast.Attribute) and \
                        facts.is_run(value.func.value):
                    loaders.update(_target_names(node))
                elif name in makers:
                    loaders.update(_unpacked(node, makers[name]))
                elif name in _FRAMEWORK_LOADERS and isinstance(value.func, ast.Attribute):
                    # `train, val = fabric.setup_dataloaders(train, val)`: sharded per rank
                    loaders.update(n for n in _target_names(node)
                                   if name == "setup_dataloaders" or "loader" in n.lower())
                    targets = node.targets[0] if isinstance(node, ast.Assign) else node.target
                    if isinstance(targets, ast.Tuple):
                        loaders.update(t.id for t in targets.elts if isinstance(t, ast.Name) and (
                            name == "setup_dataloaders" or "loader" in t.id.lower()))
        makers = {name: flags for name, fn in facts.functions.items()
                  if (flags := _returned(fn, loaders, facts))}
    return loaders


def _unpacked(node: ast.Assign | ast.AnnAssign, flags: list[bool]) -> list[str]:
    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
    if isinstance(target, ast.Tuple) and len(target.elts) == len(flags):
        return [n for t, f in zip(target.elts, flags, strict=True)
                if f and (n := _iterated(t)) is not None]
    return _target_names(node) if flags == [True] else []


def _iterated(expr: ast.AST) -> str | None:
    """The loader a loop walks: ``loader``, ``self.loader``, ``enumerate(tqdm(loader))``."""
    while isinstance(expr, ast.Call) and expr.args:
        expr = expr.args[0]
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


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
    return bool(passed) and all(_iterated(p) in loaders for p in passed)


def _is_eval(facts: Facts, loop: ast.AST, fn: ast.AST | None) -> bool:
    for parent in facts.ancestors(loop):
        if isinstance(parent, ast.With | ast.AsyncWith) and any(
                last_name(i.context_expr) in _NO_GRAD for i in parent.items):
            return True
        if isinstance(parent, SCOPES):
            break
    if fn is None:
        return False
    decorated = any(last_name(d) in _NO_GRAD for d in fn.decorator_list)  # type: ignore[attr-defined]
    named = bool(_EVAL_NAME.search(fn.name)) and not _TRAIN_NAME.search(fn.name)  # type: ignore[attr-defined]
    evals = any(isinstance(n, ast.Call) and last_name(n) == "eval" and not n.args
                and isinstance(n.func, ast.Attribute) for n in ast.walk(fn))
    return decorated or named or evals


def _accumulated(loop: ast.For | ast.AsyncFor) -> set[str]:
    """Names the loop accumulates into: ``correct += ...``, ``meter.update(...)``."""
    found: set[str] = set()
    for node in ast.walk(loop):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            target = node.target
            while isinstance(target, ast.Subscript | ast.Attribute):
                target = target.value
            if isinstance(target, ast.Name):
                found.add(target.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("update", "append", "extend", "add_") and isinstance(
                    node.func.value, ast.Name):
            found.add(node.func.value.id)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Subscript) and isinstance(node.targets[0].value, ast.Name):
            found.add(node.targets[0].value.id)  # `losses[k] = loss.item()`
    loop_vars = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    return found - loop_vars


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
    loaders = _sharded_loaders(facts)
    if not loaders:
        return
    for node in facts.of(ast.For, ast.AsyncFor):
        if not isinstance(node, ast.For | ast.AsyncFor):
            continue
        name = _iterated(node.iter)
        fn = _function_of(facts, node)
        if name is None or fn is None:
            continue
        if name not in loaders and not _filled_with_sharded(facts, fn, name, loaders):
            continue
        if not _is_eval(facts, node, fn):
            continue
        accumulated = _accumulated(node)
        report = _reports(fn, node, accumulated) if accumulated else None
        if report is None or _reduces(facts, fn) or _result_reduced(facts, fn):
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
         "the functions it calls, or where its result goes. Known false positives: a "
         "reduction hidden in a class or module the checker does not read.",
         unreduced_eval_metric),
)
