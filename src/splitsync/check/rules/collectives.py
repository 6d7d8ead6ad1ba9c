"""Collectives that not every rank reaches: a collective (or the DDP model's forward, or a
helper that broadcasts) on rank 0 only, or after a per-rank exit from the training step
(SS207); a collective where no process group exists, and a process group whose failure is
swallowed (SS208).

Every rank must enter a collective the same number of times in the same order. Called on
rank 0 only it waits for ranks that never come (a hang until the timeout); skipped on one
rank (``if torch.isnan(loss): continue``) it pairs that rank's next call with the others'
current one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import PurePath

from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.flow import loops_of, nonmain_test, rank0_guards
from splitsync.check.groups import COLLECTIVES, collective_call
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

_NONFINITE = frozenset({"isnan", "isinf", "isfinite"})
#: Handlers broad enough to swallow a failed rendezvous (a bare `except:` is None).
_BROAD = frozenset({None, "Exception", "BaseException", "RuntimeError", "DistBackendError",
                    "DistNetworkError", "DistStoreError"})
_SKIPS = (ast.Continue, ast.Break)
_DIST_TEST = re.compile(r"distributed|is_initialized|is_dist|world_size|num_tasks|ddp|fsdp|"
                        r"num_gpus|n_gpu|is_available", re.I)








def _wrapped(facts: Facts) -> set[str]:
    """Names bound to the DDP/FSDP-wrapped model (``model = DDP(model, ...)``)."""
    names: set[str] = set()
    for call in facts.torch_calls("DistributedDataParallel", "FullyShardedDataParallel"):
        holder = facts.parents.get(call)
        if isinstance(holder, ast.Assign):
            names.update(d for t in holder.targets if (d := dotted(t)))
    return names


def _locals(fn: ast.AST | None) -> set[str]:
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    args = fn.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}


def _what(facts: Facts, call: ast.Call, wrapped: set[str]) -> str | None:
    """What makes ``call`` a collective, if it is one."""
    if collective_call(facts, call):
        return f"`{facts.text(call.func, 60)}` is a collective"
    name = dotted(call.func)
    head = (name or "").split(".")[0]
    if name in wrapped and (head in {"self", "cls"} or head not in _locals(facts.scope(call))):
        return (f"`{name}` is the DistributedDataParallel/FSDP-wrapped model, whose forward "
                "synchronises with the other ranks (buffers, FSDP's all-gathers)")
    stem = PurePath(facts.path).stem
    full = facts.resolve(call.func) or ""
    keys = {f"{stem}:{full}"} if "." not in full else {":".join(full.rsplit(".", 2)[-2:])}
    if keys & facts.project.collectives:
        return f"`{full.rsplit('.', 1)[-1]}` enters a collective (a broadcast or a barrier)"
    return None


def _paired(facts: Facts, call: ast.Call, guard: ast.AST) -> bool:
    """The same collective on the other ranks too: in the ``else:`` of the rank-0 test (an
    MPI broadcast sent by rank 0 and received by the others), or under a test true off rank
    0 (``if rank != 0: barrier()`` before, ``if rank == 0: barrier()`` after)."""
    scope = facts.scope(call)
    name = last_name(call)
    test_of = facts.parents.get(guard)
    for other in facts.inside(scope, ast.Call):
        if other is call or last_name(other) != name:
            continue
        child: ast.AST = other
        for parent in facts.ancestors(other):
            if isinstance(parent, ast.If) and (
                    (parent is test_of and any(child is s for s in parent.orelse))
                    or (nonmain_test(parent.test, facts.rank0_flags)
                        and any(child is s for s in parent.body))):
                return True
            if parent is scope:
                break
            child = parent
    return False


def _one_rank(facts: Facts) -> Iterator[Hit]:
    wrapped = _wrapped(facts)
    helpers = {k.rsplit(":", 1)[-1] for k in facts.project.collectives}
    models = {w.rsplit(".", 1)[-1] for w in wrapped}
    for call in facts.named_calls(*COLLECTIVES, *helpers, *models):
        what = _what(facts, call, wrapped)
        if what is None:
            continue
        guards = rank0_guards(facts, call)
        if not guards or _paired(facts, call, guards[0]):
            continue
        test = facts.text(guards[0], 80)
        yield Hit(call, f"`{facts.text(call, 80)}` runs only where `{test}` (line "
                  f"{guards[0].lineno}): {what}, so rank 0 waits in it for ranks that never "
                  "arrive (a hang until the timeout), or pairs with a different call of theirs.",
                  "make the call on every rank and keep only the output on rank 0 (evaluate "
                  "with the unwrapped `model.module` on rank 0, or on every rank and reduce); "
                  "a helper that broadcasts must be called by every rank.")


def _rank0_return(facts: Facts) -> Iterator[Hit]:
    """``if is_master(args): ... return -1`` in a function whose later code every rank must
    run together (open_clip's main: an existing experiment ends rank 0 only)."""
    wrapped = _wrapped(facts)
    for ret in facts.of(ast.Return):
        fn = facts.scope(ret)
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        guards = [g for g in rank0_guards(facts, ret) if facts.scope(g) is fn]
        top = next((p for p in facts.ancestors(ret) if facts.parents.get(p) is fn), None)
        if not guards or not isinstance(top, ast.If) or top not in fn.body:
            continue
        later = [c for stmt in fn.body[fn.body.index(top) + 1:]
                 for c in facts.inside(stmt, ast.Call)]
        joint = next(((c, w) for c in later if (w := _what(facts, c, wrapped))
                      or facts.is_torch(c, "DistributedDataParallel", "FullyShardedDataParallel")),
                     None)
        if joint is None or rank0_guards(facts, joint[0]):
            continue
        call, what = joint
        what = what or "the DDP/FSDP wrap broadcasts rank 0's weights to the others"
        yield Hit(ret, f"`{facts.text(ret, 40)}` leaves {fn.name}() on rank 0 only (under "
                  f"`{facts.text(guards[0], 60)}`, line {guards[0].lineno}); the other ranks go "
                  f"on to `{facts.text(call, 60)}` (line {call.lineno}): {what}, so they wait "
                  "there for a rank that has left (a hang until the timeout).",
                  "decide on every rank: check on rank 0, broadcast the answer "
                  "(`dist.broadcast_object_list`), and return on every rank together; or "
                  "raise, so the launcher stops the whole job.")


#: Words of a value measured on this rank's own batch (a loss, a KL divergence, a norm).
_PER_RANK_WORDS = re.compile(r"loss|kl|norm|reward|acc|ratio|entropy|diverg|nan|inf", re.I)
#: Calls whose result every rank shares (a reduced or gathered value, a broadcast).
_AGREED = re.compile(r"reduce|gather|broadcast|agree", re.I)
#: Calls that turn a tensor into this rank's own number (or test it).
_MEASURES = frozenset({"item", "mean", "sum", "max", "min", "norm", "tolist", "float"})


def _agreed(facts: Facts, expr: ast.AST) -> bool:
    return any(_AGREED.search(last_name(c) or "") for c in facts.inside(expr, ast.Call)) or \
        bool(re.search(r"reduced|global|all_", facts.text(expr, 200)))


def _per_rank_value(facts: Facts, test: ast.AST, fn: ast.AST | None) -> bool:
    """Does ``test`` read a value measured on this rank's own data (``torch.isnan(loss)``,
    ``approx_kl > target_kl`` with ``approx_kl = (...).mean()``), not one every rank shares
    (a step count, a reduced value)?"""
    if _agreed(facts, test):
        return False
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    if fn is not None and any(_AGREED.search(last_name(c) or "") and any(
            isinstance(x, ast.Name) and x.id in names for x in ast.walk(c))
            for c in facts.inside(fn, ast.Call)):
        return False  # `dist.broadcast(signal, src=0); if signal.item() == 0: break`
    calls = {last_name(c) for c in facts.inside(test, ast.Call)}
    if calls & _NONFINITE or "item" in calls:
        return True
    if any(_PER_RANK_WORDS.search(n) for n in names) and not any(
            n in {"epoch", "step", "steps", "i", "it"} for n in names):
        bound = [a for a in facts.inside(fn, ast.Assign)] if fn is not None else []
        measured = any(any(isinstance(t, ast.Name) and t.id in names for t in a.targets)  # type: ignore[attr-defined]
                       and ({last_name(c) for c in facts.inside(a.value, ast.Call)} & _MEASURES  # type: ignore[attr-defined]
                            or isinstance(a.value, ast.BinOp))  # type: ignore[attr-defined]
                       for a in bound)
        return measured
    return False


def _joint_in(facts: Facts, loop: ast.AST) -> ast.Call | None:
    """The first call in ``loop`` every rank must make together: a backward through a
    data-parallel model (its all-reduce) or a collective."""
    parallel = facts.project.wrapped or facts.project.framework is not None
    for call in facts.inside(loop, ast.Call):
        if (parallel and last_name(call) == "backward") or collective_call(facts, call):
            return call  # type: ignore[return-value]
    return None


def _per_rank_exit(facts: Facts) -> Iterator[Hit]:
    """``if torch.isnan(loss): continue`` before the backward of a DDP step, or ``if
    approx_kl > target_kl: break`` out of a loop that holds one: a rank leaves on its own
    batch's value while the others go on to an all-reduce it never joins."""
    if not facts.in_distributed_run:
        return
    for node in facts.of(ast.If):
        test, body = node.test, node.body  # type: ignore[attr-defined]
        if not body or not isinstance(body[-1], _SKIPS):
            continue
        loop = next(loops_of(facts, node), None)
        if loop is None or not _per_rank_value(facts, test, facts.scope(node)):
            continue
        skip = "continue" if isinstance(body[-1], ast.Continue) else "break"
        joint = _joint_in(facts, loop)
        if joint is None or (skip == "continue" and joint.lineno < node.lineno and not any(
                c.lineno > node.lineno for c in facts.inside(loop, ast.Call)
                if c is joint or last_name(c) == last_name(joint))):
            continue
        what = ("whose DDP all-reduce every rank must join" if last_name(joint) == "backward"
                else "a collective every rank must join")
        left = ("pairs its next all-reduce with the others' current one (wrong gradients, or "
                "a hang)" if skip == "continue" else "leaves the loop while the others wait in "
                "it for a rank that has gone (a hang until the timeout)")
        yield Hit(node, f"`if {facts.text(test, 60)}: {skip}` decides on this rank's own value; "
                  f"the loop holds `{facts.text(joint, 40)}` (line {joint.lineno}), {what}: "
                  f"the rank that skips {left}.",
                  "agree first: all-reduce the value or a flag (`flag = torch.tensor(float("
                  "stop))`, `dist.all_reduce(flag)`) and skip or stop on every rank together, "
                  "or zero the loss instead of skipping.")


def collective_on_some_ranks(facts: Facts) -> Iterator[Hit]:
    """SS207: a collective on rank 0 only, or skipped on one rank by a per-rank test."""
    if not facts.in_distributed_run:
        return
    yield from _one_rank(facts)
    yield from _rank0_return(facts)
    yield from _per_rank_exit(facts)


def _dist_test(facts: Facts, test: ast.AST) -> bool:
    """Does ``test`` ask whether the run is distributed, itself or through a name bound to
    such a test in the same function (``reduce_loss = args.distributed and ...``)?"""
    if _DIST_TEST.search(facts.text(test, 300)):
        return True
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    scope = facts.scope(test)
    return bool(names) and any(
        any(isinstance(t, ast.Name) and t.id in names for t in a.targets)  # type: ignore[attr-defined]
        and _DIST_TEST.search(facts.text(a.value, 300))  # type: ignore[attr-defined]
        for a in facts.inside(scope, ast.Assign))


def _dist_guarded(facts: Facts, call: ast.AST) -> bool:
    """Under a test that the run is distributed (``if args.distributed:``,
    ``if dist.is_initialized():``), or after an early return when it is not."""
    child = call
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.If | ast.IfExp | ast.While) and child is not parent.test \
                and _dist_test(facts, parent.test):
            return True
        for name in ("body", "orelse"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and child in block and any(
                    isinstance(s, ast.If) and _DIST_TEST.search(facts.text(s.test, 300))
                    and s.body and isinstance(s.body[-1], ast.Return | ast.Raise)
                    for s in block[:block.index(child)]):
                return True
        child = parent
    return False


def _guarded_callers(facts: Facts, fn: ast.AST, depth: int = 0) -> bool:
    """Is every call of ``fn`` in this file under a distributed test?"""
    name = getattr(fn, "name", None)
    sites = [c for c, _ in facts.calls if last_name(c) == name]
    if not sites or depth > 2:
        return False
    return all(_dist_guarded(facts, c) or _guarded_callers(facts, facts.scope(c), depth + 1)
               for c in sites)


def _swallowed_init(facts: Facts) -> Iterator[Hit]:
    for node in facts.of(ast.Try):
        inits = [c for s in node.body for c in facts.inside(s, ast.Call)  # type: ignore[attr-defined]
                 if facts.is_torch(c, "init_process_group")]
        if not inits:
            continue
        for handler in node.handlers:  # type: ignore[attr-defined]
            caught = {last_name(t) for t in (handler.type.elts if isinstance(
                handler.type, ast.Tuple) else [handler.type])} if handler.type else {None}
            if not caught & _BROAD:
                continue  # `except (KeyError, ValueError)`: no launcher variables, one process
            if not any(isinstance(n, ast.Raise) for n in facts.inside(handler, ast.Raise)) \
                    and not any(last_name(c) in {"exit", "_exit"} for c in
                                facts.inside(handler, ast.Call)):
                yield Hit(handler, f"`{facts.text(inits[0], 60)}` fails into this `except` "
                          "and the process carries on: launched with several processes, each "
                          "one then trains alone as rank 0 of 1, on the whole data set, and "
                          "writes rank 0's files.",
                          "let the error propagate (or re-raise after logging): a run asked "
                          "for N processes must not fall back to N independent runs.")


def group_missing(facts: Facts) -> Iterator[Hit]:
    """SS208: a collective where the process group may not exist; an init failure swallowed."""
    yield from _swallowed_init(facts)
    if not facts.project.optional_group:
        return
    for call, full in facts.calls:
        if not full.startswith("torch.distributed.") or last_name(call) not in COLLECTIVES:
            continue
        if _dist_guarded(facts, call) or _guarded_callers(facts, facts.scope(call)):
            continue
        if any(c.lineno < call.lineno for c in facts.torch_calls("init_process_group")
               if facts.scope(c) is facts.scope(call)):
            continue  # right after the group is created, on the path that creates it
        yield Hit(call, f"`{facts.text(call, 80)}` runs whether or not a process group "
                  "exists, but the project sets one up only when launched distributed (its "
                  "set-up sets `distributed = False` and returns otherwise): a one-process run "
                  "fails here with \"Default process group has not been initialized\".",
                  "call it only in a distributed run (`if dist.is_initialized():`, or "
                  "`if args.distributed:`), as the project's other collectives are.")


RULES = (
    Rule("SS207", "collective-on-some-ranks", "error",
         "a collective (or the DDP model's forward, or a helper that broadcasts) on rank 0 "
         "only, or skipped on one rank by a per-rank test",
         "Every rank must enter each collective the same number of times: `dist.barrier()`, "
         "an all-reduce, an MPI broadcast hidden in a helper (guided-diffusion's "
         "`dist_util.load_state_dict`), or the forward of a DDP/FSDP-wrapped model. Called "
         "under `if rank == 0:` (or in a function only called there), rank 0 waits for ranks "
         "that never arrive; skipped on one rank by a test of its own value (`if "
         "torch.isnan(loss): continue` before the backward), that rank's next call pairs "
         "with the others' current one. The rank-0-first idiom, a barrier for the other "
         "ranks before and one for rank 0 after, is recognised. Known false positives: a "
         "DDP model without buffers whose forward syncs nothing (still fragile), a helper "
         "whose collective is skipped at run time.", collective_on_some_ranks),
    Rule("SS208", "process-group-missing", "error",
         "a collective where no process group may exist, or a failed init_process_group "
         "swallowed",
         "A project whose set-up initialises the process group only when launched "
         "distributed (`args.distributed = False` otherwise) runs as one process too; a "
         "collective called there without `if args.distributed:` raises \"Default process "
         "group has not been initialized\". A `try: init_process_group(...) except: ...` that "
         "carries on turns a failed N-process launch into N independent runs. Known false "
         "positives: a collective in a function only called under a distributed test from "
         "another module.", group_missing),
)
