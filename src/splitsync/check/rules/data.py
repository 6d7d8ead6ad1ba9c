"""Data sharding: no DistributedSampler in a data-parallel script (SS301), a sampler whose
epoch is never advanced (SS302), and a random split that differs between ranks (SS303)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.evidence import calls_unseen, unseen_source
from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.flow import loops_of
from splitsync.check.loaders import iterated
from splitsync.check.model import Hit, Rule
from splitsync.check.sharding import sharded

__all__ = ["RULES"]

#: Framework calls that shard the loaders handed to them (Accelerate, Lightning Fabric).
_FRAMEWORK_SHARDERS = frozenset({"prepare", "prepare_data_loader", "setup_dataloaders"})
#: torch functions that draw random numbers.
RANDOM = frozenset({"randn", "rand", "randint", "randperm", "normal", "randn_like", "rand_like",
                    "randint_like", "bernoulli", "multinomial"})


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_false(expr: ast.AST | None) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is False












def _random_inputs(facts: Facts) -> list[ast.Call]:
    """Random batches drawn with torch's generator in a function that trains (calls backward):
    synthetic input rather than a dataset."""
    scopes = {id(facts.scope(b)) for b in facts.method_calls("backward")}
    return [c for c in facts.torch_calls(*RANDOM) if id(facts.scope(c)) in scopes]


def _trains_in_parallel(facts: Facts) -> ast.AST | None:
    """The DDP/FSDP wrap (or splitsync model call) that makes this a data-parallel script."""
    wraps = (facts.torch_calls("DistributedDataParallel", "FullyShardedDataParallel",
                               "fully_shard") + facts.run_calls("model"))
    return wraps[0] if wraps else None


def _training_loop(facts: Facts) -> ast.AST | None:
    for call in facts.method_calls("backward"):
        loop = next(loops_of(facts, call), None)
        if loop is not None:
            return loop
    return None


def unsharded_data(facts: Facts) -> Iterator[Hit]:
    """SS301: a data-parallel script whose ranks all read the same data."""
    wrap = _trains_in_parallel(facts)
    if wrap is None or not facts.is_script or sharded(facts) or facts.project.sharded:
        return
    if any(last_name(c) in _FRAMEWORK_SHARDERS and facts.scope(c) is facts.scope(wrap)
           and any("loader" in (dotted(a) or "").lower() for a in c.args)
           for c, _ in facts.calls):
        return  # `accelerator.prepare(..., train_loader)` where the model is wrapped
    loaders = facts.torch_calls("DataLoader")
    drawn = _random_inputs(facts)
    if not loaders and drawn:
        if not facts.project.same_seed:
            return  # unseeded random input is different data on every rank
        yield Hit(drawn[0], f"`{facts.text(drawn[0], 120)}` draws the training input after a seed "
                  "every rank shares: each rank draws the same random batches, so the ranks "
                  "repeat each other's work (whether that matters for synthetic data depends "
                  "on what the script is for).",
                  "seed the data stream per rank (`torch.Generator().manual_seed(seed + rank)` "
                  "passed as `generator=`) or read real data through a DistributedSampler "
                  "(`run.loader(...)` in splitsync).", severity="warning")
        return
    fix_torch = ("shard it: `sampler = DistributedSampler(dataset, shuffle=True)`, "
                 "`DataLoader(dataset, batch_size=B, sampler=sampler)` and "
                 "`sampler.set_epoch(epoch)` at the start of every epoch")
    fix_ss = "or in splitsync `loader = run.loader(dataset, batch_size=B, shuffle=True)`"
    if facts.is_splitsync:
        fix_torch = "pass it through `run.loader(...)`, which adds the DistributedSampler"
        fix_ss = "and iterate `run.epochs(n)` so each epoch reshuffles"
    for call in loaders:
        if _kw(call, "sampler") is not None or _kw(call, "batch_sampler") is not None:
            continue
        if unseen_source(facts, call.args[0] if call.args else _kw(call, "dataset")):
            continue  # a dataset from a module that could not be read may shard itself
        shuffle = _kw(call, "shuffle")
        moved = (" (its `shuffle=` moves to the sampler: DataLoader refuses both)"
                 if shuffle is not None and not _is_false(shuffle) else "")
        yield Hit(call, f"`{facts.text(call, 200)}` in a data-parallel script has no `sampler=`: "
                  "every rank iterates the whole dataset in the same order, so each sample is "
                  "seen once per rank per step and N processes train no faster than one.",
                  f"{fix_torch}{moved}, {fix_ss}.")
    if loaders:
        return
    where = _training_loop(facts)
    if where is None or facts.scope(where) is not facts.scope(wrap):
        return  # the loop and the wrap live apart (a profiler, a model class): no evidence
    if unseen_source(facts, getattr(where, "iter", None)):
        return  # the batches come from a module that could not be read: it may shard them
    yield Hit(where, f"every rank trains on the same data: the model is wrapped for data-parallel "
              f"training (line {wrap.lineno}) but nothing splits the data between ranks (no "
              "DistributedSampler, no `run.loader`, no slicing by rank), so N processes repeat "
              "one process's work.", f"build the batches from a dataset and {fix_torch}, {fix_ss}.")


def _sampler_names(facts: Facts, call: ast.Call) -> tuple[set[str], set[str]]:
    """The names the sampler is reachable by: its own variables, and loaders built from it."""
    samplers: set[str] = set()
    loaders: set[str] = set()
    node: ast.AST = call
    parent = facts.parents.get(node)
    if isinstance(parent, ast.keyword):  # DataLoader(..., sampler=DistributedSampler(...))
        holder = facts.parents.get(facts.parents[parent])
        if isinstance(holder, ast.Assign):
            loaders.update(d for t in holder.targets if (d := dotted(t)))
    elif isinstance(parent, ast.Assign):
        samplers.update(d for t in parent.targets if (d := dotted(t)))
    for loader in facts.torch_calls("DataLoader"):
        value = _kw(loader, "sampler")
        holder = facts.parents.get(loader)
        if value is not None and dotted(value) in samplers and isinstance(holder, ast.Assign):
            loaders.update(d for t in holder.targets if (d := dotted(t)))
    return samplers, loaders


def _advances(facts: Facts, call: ast.Call) -> bool:
    """In a loop, or fed a variable epoch (``def run_epoch(epoch): sampler.set_epoch(epoch)``)."""
    return next(loops_of(facts, call), None) is not None or any(
        not isinstance(a, ast.Constant) for a in call.args)


def _passed_to(facts: Facts, call: ast.Call, names: set[str]) -> bool:
    """``def train(..., sampler=None): sampler.set_epoch(epoch)`` called with one of ``names``:
    the sampler is advanced through the helper's parameter."""
    receiver = call.func.value  # type: ignore[attr-defined]
    scope = facts.scope(call)
    if not isinstance(receiver, ast.Name) or not isinstance(
            scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    params = {a.arg for a in (*scope.args.args, *scope.args.kwonlyargs)}
    if receiver.id not in params:
        return False
    return any(last_name(site) == scope.name and any(
        dotted(v) in names for v in (*site.args, *(k.value for k in site.keywords)))
        for site, _ in facts.calls)


def _holds(value: ast.AST, sampler: ast.Call, names: set[str]) -> bool:
    """Is ``value`` the sampler, one of ``names``, or a loader built on them
    (``DataLoader(ds, sampler=sampler)``)?"""
    if value is sampler or dotted(value) in names:
        return True
    given = _kw(value, "sampler") if isinstance(value, ast.Call) else None
    return given is not None and (given is sampler or dotted(given) in names)


def _made_names(facts: Facts, sampler: ast.Call, names: set[str]) -> list[tuple[ast.AST, str]]:
    """(scope, name) pairs that hold the sampler or a loader built from it: the names of its
    own function, and, when that function returns one of them (``return
    DistributedSampler(ds)``, ``return train_loader``), what its callers bind the result to
    (``loader = DataLoader(ds, sampler=data_sampler(ds))``, ``loader = build_loader()``)."""
    scope = facts.scope(sampler)
    found = [(scope, n) for n in names]
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return found
    returns = [r for r in facts.inside(scope, ast.Return) if isinstance(r, ast.Return)
               and r.value is not None and facts.scope(r) is scope]
    # positions of what is returned that hold it: [-1] for the whole value
    held = {-1 if not isinstance(r.value, ast.Tuple) else at
            for r in returns for at, e in enumerate(getattr(r.value, "elts", [r.value]))
            if _holds(e, sampler, names)}
    if not held:
        return found
    for site in facts.named_calls(scope.name):
        holder = facts.parents.get(site)
        if isinstance(holder, ast.keyword) and holder.arg == "sampler":
            holder = facts.parents.get(facts.parents.get(holder))  # type: ignore[arg-type]
        if not isinstance(holder, ast.Assign) or len(holder.targets) != 1:
            continue
        target = holder.targets[0]
        parts = [target] if -1 in held else [
            e for at, e in enumerate(getattr(target, "elts", [])) if at in held]
        found += [(facts.scope(site), d) for t in parts if (d := dotted(t))]
    return found


def _loops_over(facts: Facts, scope: ast.AST, name: str, depth: int = 0,
                via: ast.AST | None = None) -> Iterator[ast.AST]:
    """The loops that iterate ``name`` of ``scope`` again and again: the loop around a ``for
    batch in name:`` (or around the call that hands ``name`` to a function of the file that
    iterates it: ``train_one_epoch(model, name)``, ``sample_data(name)``)."""
    for node in facts.walk_scope(scope):
        if isinstance(node, ast.For | ast.AsyncFor) and iterated(node.iter) == name.rsplit(
                ".", 1)[-1]:
            outer = next(loops_of(facts, node), None)
            if outer is None and via is not None:
                outer = next(loops_of(facts, via), None)
            if outer is not None:
                yield outer
        elif isinstance(node, ast.Call) and depth < 3 and (
                callee := facts.functions.get(last_name(node) or "")) is not None:
            params = [a.arg for a in (*callee.args.posonlyargs, *callee.args.args)]
            for at, arg in enumerate(node.args):
                if dotted(arg) == name and at < len(params):
                    yield from _loops_over(facts, callee, params[at], depth + 1,
                                           node if next(loops_of(facts, node), None) else via)


def _epoch_loop(facts: Facts, sampler: ast.Call, names: set[str]) -> ast.AST | None:
    """The one epoch loop that walks this sampler's loader, when it is in another function
    than the sampler (there the user adds ``set_epoch``); None when none or several."""
    loops = {id(loop): loop for scope, name in _made_names(facts, sampler, names)
             for loop in _loops_over(facts, scope, name)}
    if len(loops) != 1:
        return None
    loop = next(iter(loops.values()))
    return loop if facts.scope(loop) is not facts.scope(sampler) else None


def set_epoch_missing(facts: Facts) -> Iterator[Hit]:
    """SS302: a shuffling DistributedSampler whose ``set_epoch`` is never called in a loop."""
    calls = facts.method_calls("set_epoch")
    if not calls and "set_epoch" in facts.project.called:
        return  # advanced in a helper module of the same project
    advanced = [c for c in calls if _advances(facts, c)]
    for sampler in facts.torch_calls("DistributedSampler"):
        if _is_false(_kw(sampler, "shuffle")):
            continue
        samplers, loaders = _sampler_names(facts, sampler)
        names = samplers | loaders
        mine = [c for c in calls if not names
                or (receiver := dotted(c.func.value)) in names  # type: ignore[attr-defined]
                or (receiver or "").endswith(".sampler") or _passed_to(facts, c, names)]
        if any(_advances(facts, c) for c in mine):
            continue
        if advanced and not mine:
            continue  # the script advances its training sampler; this one feeds evaluation
        if calls_unseen(facts, *names):
            continue  # handed to a function that could not be read: it may call set_epoch
        target = (sorted(samplers)[0] if samplers else
                  f"{sorted(loaders)[0]}.sampler" if loaders else "sampler")
        detail = (f"`set_epoch` is called only outside the epoch loop (line {mine[0].lineno})"
                  if mine else "`set_epoch` is never called")
        loop = _epoch_loop(facts, sampler, names)
        if loop is not None:  # reported where the call goes, the sampler far away
            yield Hit(loop, f"this loop walks a loader sharded by `{facts.text(sampler, 120)}` "
                      f"(line {sampler.lineno}, {facts.scope_name(sampler)}), which shuffles, but "
                      f"{detail}: the sampler seeds its shuffle with the epoch number, so every "
                      "pass repeats the first epoch's order on every rank.",
                      "call `set_epoch(epoch)` on that sampler at the start of each pass of this "
                      "loop (`loader.sampler.set_epoch(epoch)`; splitsync's `run.epochs(n)` does "
                      "it for you).")
            continue
        yield Hit(sampler, f"`{facts.text(sampler, 200)}` shuffles, but {detail}: the sampler seeds "
                  "its shuffle with the epoch number, so every epoch repeats the first epoch's "
                  "order on every rank.",
                  f"call `{target}.set_epoch(epoch)` at the start of each epoch, inside "
                  "`for epoch in ...:` before iterating the loader (splitsync's `run.epochs(n)` "
                  "does it for you); an evaluation-only sampler should pass `shuffle=False`.")
    yield from _splitsync_epochs(facts, calls)


def _splitsync_epochs(facts: Facts, calls: list[ast.Call]) -> Iterator[Hit]:
    if facts.run_calls("epochs") or calls:
        return
    for call in facts.run_calls("loader"):
        shuffle = _kw(call, "shuffle")
        holder = facts.parents.get(call)
        if shuffle is None or _is_false(shuffle) or not isinstance(holder, ast.Assign):
            continue
        names = {d for t in holder.targets if (d := dotted(t))}
        for loop in facts.nodes:
            if not isinstance(loop, ast.For) or not any(
                    dotted(n) in names for n in ast.walk(loop.iter)):
                continue
            outer = next(loops_of(facts, loop), None)
            if outer is None:
                continue
            yield Hit(call, f"`{facts.text(call, 200)}` shuffles, but the epoch loop at line "
                      f"{outer.lineno} is not `run.epochs(...)` and never calls "
                      "`set_epoch`: every epoch repeats the same order.",
                      f"write `for epoch in run.epochs({_epochs_arg(facts, outer)}):` (it calls "
                      "`set_epoch` on every run.loader), or call "
                      f"`{sorted(names)[0]}.set_epoch(epoch)` first thing in each epoch.")
            break


def _seeded_generator(facts: Facts, expr: ast.AST | None) -> bool:
    """Is ``generator=`` a generator given a seed (``torch.Generator().manual_seed(42)``)?"""
    if expr is None or (isinstance(expr, ast.Constant) and expr.value is None):
        return False
    if isinstance(expr, ast.Call) and last_name(expr) == "Generator":
        return False  # a fresh generator is seeded from the clock
    return True  # a variable or `.manual_seed(...)`: assume the author seeded it


def random_split_unseeded(facts: Facts) -> Iterator[Hit]:
    """SS303: ``random_split`` without a seeded generator in a distributed run."""
    if not facts.in_distributed_run:
        return
    for call in facts.torch_calls("random_split"):
        if _seeded_generator(facts, _kw(call, "generator")) or len(call.args) > 2:
            continue
        if facts.project.same_seed:
            continue  # the global generator was seeded alike on every rank
        yield Hit(call, f"`{facts.text(call, 200)}` splits with the unseeded global generator in "
                  "a distributed run: every rank draws a different split, so one rank's test "
                  "samples are another rank's training samples and the evaluation is "
                  "contaminated.",
                  "pass a generator seeded alike on every rank: `random_split(dataset, lengths, "
                  "generator=torch.Generator().manual_seed(42))` (or split once, offline).")


def _epochs_arg(facts: Facts, loop: ast.For | ast.While | ast.AsyncFor) -> str:
    it = getattr(loop, "iter", None)
    if isinstance(it, ast.Call) and last_name(it) == "range" and len(it.args) in (1, 2):
        stop = facts.text(it.args[-1], 200)
        return stop if len(it.args) == 1 else f"{stop}, start={facts.text(it.args[0], 200)}"
    return "n"


RULES = (
    Rule("SS301", "unsharded-data", "error",
         "data-parallel script without a DistributedSampler (every rank trains on the same data)",
         "Data parallelism means splitting the data and syncing the gradients. Without a "
         "DistributedSampler (or run.loader) each rank reads every sample, so the gradient "
         "average is over identical batches: the lesson's DDP example admits it skips the "
         "sampler. Random input drawn per rank with torch's generator unseeded is different "
         "data on every rank and is not flagged; drawn after a seed every rank shares it is "
         "the same data (a warning). Known false positives: datasets that shard themselves by "
         "rank inside code the checker cannot read (an IterableDataset reading its rank).",
         unsharded_data),
    Rule("SS302", "set-epoch-missing", "warning",
         "DistributedSampler.set_epoch never called in the epoch loop",
         "DistributedSampler shuffles with seed + epoch. Without set_epoch(epoch) the epoch "
         "stays 0 and every epoch uses the same permutation. set_epoch called in another "
         "module of the project (a train_one_epoch helper) counts, and so does a helper that "
         "advances a sampler passed to it (`train(..., sampler=s)` calling "
         "`sampler.set_epoch(epoch)`). Once a script advances one sampler, the others are "
         "taken to feed evaluation (where the order does not matter) and are not reported. "
         "When the sampler is built in another function of the file than the one epoch loop "
         "that walks its loader, the finding is reported at that loop, where the call goes. "
         "Known false positives: set_epoch reached through code the checker cannot read (a "
         "third-party trainer).", set_epoch_missing),
    Rule("SS303", "random-split-unseeded", "warning",
         "random_split without a seeded generator in a distributed script",
         "torch.utils.data.random_split draws from the global generator. Each rank of a "
         "distributed run that has not seeded it alike draws its own permutation, so the "
         "train/test split differs per rank and test data leaks into training. Pass "
         "`generator=torch.Generator().manual_seed(SEED)`. Known false positives: the global "
         "generator seeded alike on every rank in code the checker cannot read; datasets whose "
         "split is irrelevant (throw-away synthetic data).", random_split_unseeded),
)

