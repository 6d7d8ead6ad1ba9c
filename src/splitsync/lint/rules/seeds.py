"""Seeding: a distributed script that builds its model before any random seed is set (SS401)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.lint.facts import Facts, last_name
from splitsync.lint.model import Hit, Rule

__all__ = ["RULES"]

_WRAPS = ("DistributedDataParallel", "FullyShardedDataParallel", "fully_shard")


def _constructor(expr: ast.AST) -> ast.Call | None:
    """``Net()`` in ``Net().to(device)``: the class call at the root of a method chain."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
            and not (expr.func.attr[:1].isupper()):
        expr = expr.func.value
    if isinstance(expr, ast.Call) and (last_name(expr) or "")[:1].isupper():
        return expr
    return None


def _built_at(facts: Facts, wrap: ast.Call) -> tuple[ast.AST, ast.Call] | None:
    """Where the wrapped model was constructed: (statement or call, constructor call)."""
    if not wrap.args:
        return None
    arg = wrap.args[0]
    ctor = _constructor(arg)
    if ctor is not None:
        return wrap, ctor
    if not isinstance(arg, ast.Name):
        return None
    scope = facts.scope(wrap)
    for node in facts.walk_scope(scope):
        if (isinstance(node, ast.Assign) and node.lineno < wrap.lineno
                and any(isinstance(t, ast.Name) and t.id == arg.id for t in node.targets)):
            ctor = _constructor(node.value)
            if ctor is not None:
                return node, ctor
    return None


def _is_seed(call: ast.Call) -> bool:
    name = (last_name(call) or "").lower()
    return "seed" in name and not name.startswith(("get", "initial"))


def _counts(facts: Facts, seed: ast.Call, model: ast.AST) -> bool:
    """Does ``seed`` run before ``model`` is built, on every rank?"""
    seed_scope, model_scope = facts.scope(seed), facts.scope(model)
    if seed_scope is model_scope:
        return seed.lineno < model.lineno  # type: ignore[attr-defined]
    if isinstance(seed_scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return seed_scope.name in facts.loaded_names  # a helper such as set_seed(...) that runs
    main = facts.main_block()
    in_main = main is not None and any(a is main for a in facts.ancestors(seed))
    # spawned children re-import the module but never run its __main__ block
    return not (in_main and facts.uses_spawn)


def no_seed_before_model(facts: Facts) -> Iterator[Hit]:
    """SS401: the model of a distributed script is built with no seed set before it."""
    if not facts.is_distributed:
        return
    # splitsync.init seeds every rank (a drawn seed is broadcast when none is given)
    seeds = [c for c, _ in facts.calls if _is_seed(c)] + facts.init_calls()
    for wrap in facts.torch_calls(*_WRAPS) + facts.run_calls("model"):
        built = _built_at(facts, wrap)
        if built is None:
            continue
        where, ctor = built
        if any(_counts(facts, s, where) for s in seeds):
            continue
        late = [s for s in seeds if facts.scope(s) is facts.scope(where)]
        detail = (f"the seed is set only afterwards (line {late[0].lineno})" if late
                  else "no random seed is set before it")
        if facts.is_splitsync:
            detail = detail.replace("the seed is set", "splitsync.init seeds")
        yield Hit(where, f"the model `{facts.text(ctor, 200)}` is built at line {where.lineno} "
                  f"{facts.scope_name(where)} and {detail}: each rank draws different initial "
                  "weights and different randomness (dropout, augmentation, random splits), so "
                  "runs are not reproducible. DDP copies rank 0's weights when it wraps the "
                  "model, which hides the weight difference but nothing else.",
                  "build the model after `run = splitsync.init(seed=SEED)`, which seeds every "
                  "rank alike." if facts.is_splitsync else
                  "seed every rank with the same value before building the model: "
                  "`torch.manual_seed(SEED)` (plus `random.seed` / `numpy.random.seed` if used), "
                  "or `run = splitsync.init(seed=SEED)`.")


RULES = (
    Rule("SS401", "no-seed-before-model", "warning",
         "no random seed set before the model is built in a distributed script",
         "The lesson: seeds must be synchronised before the model is initialised so that every "
         "process starts from the same weights and the run can be reproduced.",
         no_seed_before_model),
)
