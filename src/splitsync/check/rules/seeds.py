"""Seeding: a distributed script that builds its model before any random seed is set (SS401),
and a dataset built from unseeded random numbers (SS402)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.evidence import calls_unseen, launcher_functions
from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.model import Hit, Rule
from splitsync.check.sharding import seeded_per_rank

__all__ = ["RULES"]

#: Names of a helper that may set the seed (read only when its module could not be).
_SEEDING = re.compile(r"seed|init|setup|random|determin|fix|prepare", re.I)

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


def _spawned(facts: Facts) -> dict[str, ast.Call]:
    """Functions started by ``mp.spawn(fn, ...)`` (or ``start_processes``): name -> the call."""
    found: dict[str, ast.Call] = {}
    for call, _ in facts.calls:
        if last_name(call) in {"spawn", "start_processes"} and call.args:
            target = call.args[0]
            if isinstance(target, ast.Name) and target.id in facts.functions:
                found[target.id] = call
    return found


def _seeds_in(fn: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and _is_seed(n) for n in ast.walk(fn))


def seed_before_spawn(facts: Facts) -> Iterator[Hit]:
    """Seeds set in the parent process before ``mp.spawn``: the children never see them."""
    spawned = _spawned(facts)
    launchers = launcher_functions(facts)
    main = facts.main_block()
    for name, spawn in spawned.items():
        if _seeds_in(facts.functions[name]):
            continue  # the spawned function seeds itself
        for seed, _ in facts.calls:
            if not _is_seed(seed) or not seed.args and not seed.keywords:
                continue
            scope = facts.scope(seed)
            in_parent = (isinstance(scope, ast.FunctionDef) and scope.name in launchers
                         and scope is facts.scope(spawn)) or (
                main is not None and any(a is main for a in facts.ancestors(seed)))
            if not in_parent or seed.lineno > spawn.lineno:
                continue
            yield Hit(seed, f"`{facts.text(seed)}` seeds the parent process, which then starts "
                      f"the ranks with `{facts.text(spawn, 60)}` (line {spawn.lineno}): spawned "
                      f"processes start a fresh interpreter, so `{name}` runs unseeded and every "
                      "rank draws different initial weights and random numbers.",
                      f"seed inside `{name}` (first thing, with the same value on every rank), "
                      "or use `splitsync.init(seed=...)` there.")
            break  # one finding per spawned function


def no_seed_before_model(facts: Facts) -> Iterator[Hit]:
    """SS401: the model of a distributed script is built with no seed set before it."""
    told: set[str] = set()  # spawned functions already reported through the parent's seed
    if facts.uses_spawn:
        for hit in seed_before_spawn(facts):
            told.add(hit.message.split("so `", 1)[1].split("`", 1)[0])
            yield hit
    if not facts.is_distributed:
        return
    # splitsync.init seeds every rank (a drawn seed is broadcast when none is given)
    seeds = [c for c, _ in facts.calls if _is_seed(c)] + facts.init_calls()
    for wrap in facts.torch_calls(*_WRAPS) + facts.run_calls("model"):
        built = _built_at(facts, wrap)
        scope = facts.scope(wrap)
        if built is None or getattr(scope, "name", None) in told:
            continue
        where, ctor = built
        if calls_unseen(facts, before=where, hint=_SEEDING):
            continue  # a function from a module that could not be read may set the seed
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


_NP_DRAWS = frozenset({"rand", "randn", "randint", "random", "normal", "uniform", "choice",
                       "permutation", "shuffle", "random_sample", "integers"})
_TORCH_DRAWS = frozenset({"randn", "rand", "randint", "randperm", "normal", "bernoulli",
                          "multinomial", "randn_like", "rand_like"})


def _draws(facts: Facts, call: ast.Call) -> bool:
    """Does ``call`` draw from a global random generator (torch, NumPy or ``random``)?"""
    if any(k.arg == "generator" for k in call.keywords):
        return False
    full = facts.resolve(call.func) or ""
    last = full.rsplit(".", 1)[-1]
    if full.startswith("torch.") and last in _TORCH_DRAWS:
        return True
    if (full.startswith(("numpy.random.", "np.random.")) and last in _NP_DRAWS):
        return True
    return full.startswith("random.") and last in _NP_DRAWS | {"sample", "gauss"}


def _is_dataset(cls: ast.ClassDef) -> bool:
    return any("Dataset" in (last_name(b) or "") for b in cls.bases)


def random_dataset(facts: Facts) -> Iterator[Hit]:
    """SS402: a Dataset whose ``__init__`` draws its samples from an unseeded generator."""
    if not facts.in_distributed_run or facts.project.same_seed:
        return
    for cls in (n for n in facts.nodes if isinstance(n, ast.ClassDef) and _is_dataset(n)):
        init = next((s for s in cls.body if isinstance(s, ast.FunctionDef)
                     and s.name == "__init__"), None)
        if init is None:
            continue
        calls = [n for n in ast.walk(init) if isinstance(n, ast.Call)]
        if any(_is_seed(c) for c in calls):
            continue
        drawn = next((c for c in calls if _draws(facts, c)), None)
        if drawn is None:
            continue
        yield Hit(drawn, f"`{cls.name}.__init__` builds its samples with `{facts.text(drawn, 80)}` "
                  "from an unseeded generator, in a distributed run: every rank builds a "
                  "different dataset, so the DistributedSampler's shards are slices of "
                  "different data and the ranks do not train on one dataset.",
                  "seed every rank alike before building the dataset "
                  "(`torch.manual_seed(SEED)`, or `splitsync.init(seed=SEED)`), or draw from a "
                  "generator seeded in `__init__`: `g = torch.Generator().manual_seed(seed)` "
                  "and `torch.rand(..., generator=g)`.")


_EMA = frozenset({"ModelEma", "ModelEmaV2", "ModelEmaV3", "AveragedModel", "EMA",
                  "ExponentialMovingAverage", "deepcopy"})
#: Calls after the wrap that copy the synchronised weights into the EMA again.
_RESYNC = frozenset({"update_ema", "load_state_dict", "set", "copy_", "reset", "requires_grad"})


def ema_before_broadcast(facts: Facts) -> Iterator[Hit]:
    """SS404: an EMA copied from the model before DDP broadcasts rank 0's weights, under
    seeds that differ per rank."""
    if not facts.is_distributed or not seeded_per_rank(facts):
        return
    for wrap in facts.torch_calls(*_WRAPS):
        if not wrap.args or (model := dotted(wrap.args[0])) is None:
            continue
        scope = facts.scope(wrap)
        for call, _ in facts.calls:
            if last_name(call) not in _EMA or facts.scope(call) is not scope \
                    or call.lineno >= wrap.lineno or not call.args \
                    or dotted(call.args[0]) != model:
                continue
            holder = facts.parents.get(call)
            ema = next((d for t in getattr(holder, "targets", []) if (d := dotted(t))), None)
            if ema is None:
                continue
            resync = any(last_name(c) in _RESYNC and c.lineno > wrap.lineno
                         and ema.split(".")[-1] in ast.unparse(c)
                         for c, _ in facts.calls if facts.scope(c) is scope)
            if resync:
                continue  # re-initialised from the broadcast weights (DiT's `update_ema(.., 0)`)
            yield Hit(call, f"`{facts.text(holder)}` copies the model into an EMA at line "
                      f"{call.lineno}, before `{facts.text(wrap, 60)}` (line {wrap.lineno}) "
                      "broadcasts rank 0's weights, and the seeds differ per rank: every rank's "
                      "EMA starts from its own random initialisation, so the EMAs never agree "
                      "and the one that is saved or evaluated depends on the rank.",
                      "build the EMA after wrapping, from the synchronised weights "
                      f"(`{ema} = ModelEma({model}.module)`), or copy them in after the wrap "
                      f"(`{ema}.load_state_dict({model}.module.state_dict())`); or seed every "
                      "rank alike before building the model.")


RULES = (
    Rule("SS401", "no-seed-before-model", "warning",
         "no random seed set before the model is built in a distributed script",
         "The lesson: seeds must be synchronised before the model is initialised so that every "
         "process starts from the same weights and the run can be reproduced. Known false "
         "positives: a seed set in code the checker cannot read (a launcher, a framework), and "
         "runs that do not need to be reproducible (DDP already copies rank 0's weights).",
         no_seed_before_model),
    Rule("SS402", "random-dataset-unseeded", "warning",
         "a Dataset built from unseeded random numbers in a distributed run",
         "A dataset that draws its samples in __init__ (synthetic data, random subsets) gets "
         "different samples on every rank unless every rank seeded its generator alike before "
         "building it, so the ranks shard different datasets. Seed alike first, or use a "
         "generator seeded in __init__. Known false positives: a seed set alike in code the "
         "checker cannot read (a launcher, a config hook); data that is meant to differ per "
         "rank.", random_dataset),
    Rule("SS404", "ema-before-broadcast", "warning",
         "an EMA copied from the model before DDP broadcasts rank 0's weights, under per-rank seeds",
         "DistributedDataParallel copies rank 0's parameters to every rank when it wraps the "
         "model; an EMA (timm's ModelEma, a deepcopy) taken before that keeps each rank's own "
         "random initialisation when the seed includes the rank (`seed + rank`), so the EMAs "
         "differ between ranks for the whole run. Known false positives: an EMA re-synchronised "
         "later in a way the checker does not see.", ema_before_broadcast),
)
