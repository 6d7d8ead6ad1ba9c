"""The loaders a distributed sampler shards, and the evaluation loops that walk them: what a
loop iterates (:func:`iterated`), what it accumulates (:func:`accumulated`), whether it
evaluates (:func:`is_eval`). Read by the rules on unreduced metrics (SS506) and padded
evaluation (SS304)."""

from __future__ import annotations

import ast
import re

from splitsync.check.facts import SCOPES, Facts, last_name

__all__ = ["SAMPLERS", "sharded_loaders", "iterated", "accumulated", "is_eval"]


_EVAL_NAME = re.compile(r"val|eval|test|score|metric|accura", re.I)



_TRAIN_NAME = re.compile(r"train", re.I)



#: Framework calls that shard the loaders they return (Fabric, Accelerate).
_FRAMEWORK_LOADERS = frozenset({"setup_dataloaders", "prepare"})



_NO_GRAD = frozenset({"no_grad", "inference_mode"})



SAMPLERS = ("DistributedSampler", "DistributedEvalSampler", "ElasticDistributedSampler")



def _is_dist_sampler_call(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and (last_name(expr) or "").endswith(SAMPLERS)



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
            isinstance(n, ast.Return) and n.value is not None and iterated(n.value) in loaders
            or isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
            for n in facts.inside(fn, ast.Return)):
        return []
    for node in ast.walk(fn):  # breadth first: the first such return decides
        if isinstance(node, ast.Return) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            flags = [iterated(v) in loaders for v in values]
            if any(flags):
                return flags
    return []



def sharded_loaders(facts: Facts) -> set[str]:
    """Names (or attributes) bound to a loader that a distributed sampler shards, also
    through a helper that builds and returns it (``train, val = prepare_dataset(...)``).
    Kept with the tree: SS304 and SS506 both ask."""
    memo = facts.tree_index.memo
    if "sharded_loaders" not in memo:
        memo["sharded_loaders"] = _find_sharded_loaders(facts)
    return memo["sharded_loaders"]  # type: ignore[return-value]



def _find_sharded_loaders(facts: Facts) -> set[str]:
    if not facts.named_calls(*SAMPLERS, "DataLoader", "loader", *_FRAMEWORK_LOADERS):
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
                if f and (n := iterated(t)) is not None]
    return _target_names(node) if flags == [True] else []



def iterated(expr: ast.AST) -> str | None:
    """The loader a loop walks: ``loader``, ``self.loader``, ``enumerate(tqdm(loader))``."""
    while isinstance(expr, ast.Call) and expr.args:
        expr = expr.args[0]
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None



def is_eval(facts: Facts, loop: ast.AST, fn: ast.AST | None) -> bool:
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



def accumulated(loop: ast.For | ast.AsyncFor) -> set[str]:
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
