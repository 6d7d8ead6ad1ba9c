"""Output that every rank repeats: print (SS501), torch.save (SS502) and logging (SS503)
in a distributed script, outside a rank-0 check; checkpoints written once per machine (SS504)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.evidence import launcher_functions, world_size_one
from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.flow import (
    guarded_by_rank0,
    is_local_rank_test,
    local_rank_names,
    mentions_rank,
    rank0_guards,
)
from splitsync.check.model import Hit, Rule
from splitsync.check.ranks import rank_in

__all__ = ["RULES"]



def _outer_function(facts: Facts, call: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The top-level function (or method) ``call`` is in, if any."""
    found = None
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
            found = parent
    return found


def _own_main_only(facts: Facts, call: ast.AST) -> bool:
    """Is ``call`` reached only from this module's own ``__main__`` block (directly, or in a
    function only that block calls)?"""
    main = facts.main_block()
    if main is None:
        return False
    if any(a is main for a in facts.ancestors(call)):
        return True
    outer = _outer_function(facts, call)
    if outer is None:
        return False
    sites = [c for c, _ in facts.calls if last_name(c) == outer.name]
    return bool(sites) and all(any(a is main for a in facts.ancestors(c)) for c in sites)


def _every_rank(facts: Facts, call: ast.Call) -> bool:
    """Does ``call`` run on every rank of a distributed script?"""
    if not facts.in_distributed_run or guarded_by_rank0(facts, call) \
            or world_size_one(facts, call):
        return False
    main = facts.main_block()
    if facts.uses_spawn and main is not None and any(a is main for a in facts.ancestors(call)):
        return False  # spawned children never run the parent's __main__ block
    scope = facts.scope(call)
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) \
            and scope.name in launcher_functions(facts):
        return False  # the function that starts the ranks runs once, in the parent
    if not facts.is_distributed and facts.project.framework is None \
            and _own_main_only(facts, call):
        return False  # a helper module's self-test: runs when the file is run alone
    outer = _outer_function(facts, call)
    if not facts.is_script and outer is not None and outer.name not in facts.project.called \
            and outer.name not in facts.loaded_names:
        return False  # a library function no module of the project calls: no evidence it runs
    return True


def _guard(facts: Facts) -> str:
    if facts.is_splitsync:
        return "`if run.is_main:`"
    return "`if rank == 0:` (or `dist.get_rank() == 0`)"


def _rank_derived(facts: Facts, scope: ast.AST) -> set[str]:
    """Names in ``scope`` computed from a rank (``device = f"cuda:{rank}"``): a message that
    shows one names its process."""
    names: set[str] = set()
    assigns = [n for n in facts.walk_scope(scope)
               if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None]
    loops = [n for n in facts.walk_scope(scope) if isinstance(n, ast.For | ast.AsyncFor)]
    for _ in range(3):  # `local = int(os.environ["LOCAL_RANK"])`, then `device = f"..{local}"`
        before = len(names)
        for loop in loops:  # `for path in files[rank::world]`: each rank its own items
            if rank_in(facts, loop.iter):
                names.update(t.id for t in ast.walk(loop.target) if isinstance(t, ast.Name))
        for node in assigns:
            if rank_in(facts, node.value) or (names and any(
                    isinstance(n, ast.Name) and n.id in names
                    for n in facts.subtree(node.value))):  # type: ignore[arg-type]
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        if len(names) == before:
            break
    return names


def _names_rank(facts: Facts, call: ast.Call, cache: dict[int, set[str]]) -> bool:
    parts = [*call.args, *call.keywords]
    if mentions_rank(parts, facts) or any(
            last_name(n) == "getpid" for p in parts for n in facts.subtree(p)):
        return True  # the rank or the process id: the line says which process wrote it
    scope = facts.scope(call)
    if id(scope) not in cache:
        cache[id(scope)] = _rank_derived(facts, scope)
    derived = cache[id(scope)]
    return bool(derived) and any(isinstance(n, ast.Name) and n.id in derived
                                 for p in parts for n in facts.subtree(p))


def _is_print(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
        and last_name(stmt.value) == "print"


def _before_exit(facts: Facts, call: ast.Call) -> bool:
    """``print("need 2 GPUs"); sys.exit()``: every rank says why it stops, then stops (several
    lines of explanation before the exit count too)."""
    stmt = facts.parents.get(call)
    for name in ("body", "orelse"):
        block = getattr(facts.parents.get(stmt), name, None) if stmt is not None else None
        if isinstance(block, list) and stmt in block:
            rest = block[block.index(stmt) + 1:]
            while rest and _is_print(rest[0]):
                rest = rest[1:]
            if rest and (isinstance(rest[0], ast.Return | ast.Raise) or (
                    isinstance(rest[0], ast.Expr) and last_name(rest[0].value) in {
                        "exit", "_exit", "quit"})):
                return True
    return False


_OPT_IN = re.compile(r"verbose|debug|^print_|_print$|^show_", re.I)


def _opt_in(facts: Facts, call: ast.Call) -> bool:
    """``if self.print_text: print(...)``: diagnostics the user switches on for a debug run."""
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.If) and any(
                _OPT_IN.search(last_name(n) or "") for n in ast.walk(parent.test)
                if isinstance(n, ast.Name | ast.Attribute)):
            return True
    return False


def unguarded_print(facts: Facts) -> Iterator[Hit]:
    """SS501: ``print`` on every rank."""
    if "print" in facts.functions or facts.project.print_override:
        return  # print is replaced by a rank-0-only one (`setup_for_distributed(is_master)`)
    cache: dict[int, set[str]] = {}
    for call, full in facts.calls:
        if full != "print" or not isinstance(call.func, ast.Name) or not _every_rank(facts, call):
            continue
        if _names_rank(facts, call, cache) or _before_exit(facts, call) or _opt_in(facts, call):
            continue  # the line names its rank, says why the process stops, or is opted into
        if any(k.arg == "file" for k in call.keywords):
            continue  # writes to a file (a per-rank log), not to the shared console
        framework = facts.project.framework
        if framework is not None:
            how = "fabric.print(...)" if framework == "Fabric" else "accelerator.print(...)"
            yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} is a plain print in a "
                      f"{framework} script: {framework} runs this code in every process, so the "
                      "line appears once per process.",
                      f"use `{how}`, which prints on the main process only.")
            continue
        fix = ("use `run.print(...)`, which prints on rank 0 only" if facts.is_splitsync
               else f"print under {_guard(facts)}, or put the rank in the message if every "
               "process should report")
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} runs on every rank: with "
                  "N processes the line appears N times, interleaved.", f"{fix}.")


def _buffers(facts: Facts) -> set[str]:
    """Names bound to in-memory buffers (``io.BytesIO()``): saving there writes no file."""
    names: set[str] = set()
    for node in facts.of(ast.Assign, ast.withitem):
        if isinstance(node, ast.Assign):
            value, targets = node.value, node.targets
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            value, targets = node.context_expr, [node.optional_vars]
        else:
            continue
        if isinstance(value, ast.Call) and last_name(value) == "BytesIO":
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


#: Functions that write one checkpoint file (not the collective ``torch.distributed.checkpoint``).
_SAVERS = frozenset({"torch.save", "safetensors.torch.save_file", "safetensors.torch.save_model"})


def _saves(facts: Facts) -> Iterator[tuple[ast.Call, ast.AST | None]]:
    """Checkpoint writes and their target (None when unseen), skipping in-memory buffers and
    paths that name the rank (one file per rank on purpose)."""
    buffers = _buffers(facts)
    for c, full in facts.calls:
        if full not in _SAVERS:
            continue
        target = c.args[1] if len(c.args) > 1 else next(
            (k.value for k in c.keywords if k.arg in {"f", "filename"}), None)
        if target is not None and (mentions_rank([target], facts) or dotted(target) in buffers
                                   or last_name(target) == "BytesIO"):
            continue
        yield c, target


def unguarded_save(facts: Facts) -> Iterator[Hit]:
    """SS502: ``torch.save`` on every rank."""
    for c, target in _saves(facts):
        if not _every_rank(facts, c):
            continue
        what = f"`{facts.text(target, 200)}`" if target is not None else "the file"
        yield Hit(c, f"`{facts.text(c)}` {facts.scope_name(c)} runs on every rank: N processes "
                  f"write {what} at the same time, which can leave it truncated or mixed, and "
                  "N-1 of the writes are wasted.",
                  f"save under {_guard(facts)}, then `dist.barrier()` before any rank reads it "
                  "back (`run.barrier()` in splitsync).")


def save_per_node(facts: Facts) -> Iterator[Hit]:
    """SS504: a checkpoint written under ``local_rank == 0``: once per machine."""
    if not facts.in_distributed_run:
        return
    local = local_rank_names(facts)
    for c, target in _saves(facts):
        if target is not None and any("local" in (last_name(n) or "").lower()
                                      for n in ast.walk(target)):
            continue  # `args.local_out_dir`: a node-local disk, one copy per machine on purpose
        guards = rank0_guards(facts, c)
        if not guards or not all(is_local_rank_test(g, local) for g in guards):
            continue
        what = f"`{facts.text(target, 200)}`" if target is not None else "the file"
        test = facts.text(guards[0], 80)
        yield Hit(c, f"`{facts.text(c)}` is guarded by `{test}`, the rank within one machine: "
                  f"on a multi-node run one process per node writes {what}, so several "
                  "processes write the same file on a shared filesystem at once.",
                  "guard checkpoint writes by the global rank, `if dist.get_rank() == 0:` "
                  "(`int(os.environ[\"RANK\"]) == 0` under torchrun; `run.is_main` in "
                  "splitsync), and `dist.barrier()` before any rank reads the file.")


def _loggers(facts: Facts) -> set[str]:
    names = {"logging"}
    for node in facts.of(ast.Assign):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and facts.resolve(node.value.func) == "logging.getLogger":
            names.update(d for t in node.targets if (d := dotted(t)))
    return names


def unguarded_logging(facts: Facts) -> Iterator[Hit]:
    """SS503: ``logger.info`` on every rank."""
    if facts.project.log_rank_limited or not facts.project.log_configured:
        return  # configured per rank elsewhere, or INFO is never shown (root level WARNING)
    loggers = _loggers(facts)
    for call in facts.method_calls("info"):
        receiver = call.func.value  # type: ignore[attr-defined]
        name = "logging" if facts.resolve(receiver) == "logging" else dotted(receiver)
        if name not in loggers or not _every_rank(facts, call):
            continue
        if mentions_rank([*call.args, *call.keywords], facts):
            continue
        alt = " or `run.logger`, whose lines carry the rank" if facts.is_splitsync else ""
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} logs on every rank: each "
                  "record is written N times with nothing telling the copies apart.",
                  f"log under {_guard(facts)}, or put the rank in the format{alt}.")


_TREE_WRITES = frozenset({"shutil.copytree", "shutil.copyfile", "shutil.copy", "shutil.copy2",
                          "shutil.rmtree", "shutil.move", "os.remove", "os.replace"})


def _write_mode(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and "w" in mode.value


def shared_file_writes(facts: Facts) -> Iterator[Hit]:
    """SS505: every rank copies a tree or truncates a file (``open(path, "w")``)."""
    if not facts.in_distributed_run:
        return
    for call, full in facts.calls:
        tree = full in _TREE_WRITES
        if not tree and not (full == "open" and _write_mode(call)):
            continue
        target = call.args[-1] if tree and call.args else (call.args[0] if call.args else None)
        if target is None or mentions_rank([target], facts) or not _every_rank(facts, call):
            continue
        if _names_rank(facts, call, {}):
            continue  # the path is built from the rank: one file per process
        what = "copies or removes files" if tree else "truncates and writes"
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} runs on every rank and "
                  f"{what} `{facts.text(target, 80)}`: N processes race on the same path, so "
                  "the file can end up truncated, interleaved or half-copied.",
                  f"do it once, under {_guard(facts)}, then `dist.barrier()` before any rank "
                  "reads it; or put the rank in the path if every process needs its own.")


RULES = (
    Rule("SS501", "unguarded-print", "warning",
         "print in a distributed script not guarded by a rank-0 check",
         "Every process runs the whole script; output meant once must be guarded by a rank-0 "
         "check (splitsync: run.print). A print that names its rank (or a value computed from "
         "it) is treated as deliberate, and no print is flagged when the project replaces "
         "builtins.print with a rank-0-only one (`setup_for_distributed(is_master)`). Known "
         "false positives: print replaced by other means (a logging redirect, a wrapper "
         "module the checker cannot read).", unguarded_print),
    Rule("SS502", "unguarded-save", "warning",
         "torch.save in a distributed script not guarded by a rank-0 check",
         "Concurrent writers of one checkpoint file can corrupt it; save on rank 0 and barrier. "
         "Paths that contain the rank (one file per rank) are allowed. Known false positives: a "
         "helper that is only ever called on rank 0 from another project the checker does not "
         "read; saves to node-local scratch disks meant per process.", unguarded_save),
    Rule("SS503", "unguarded-logging", "warning",
         "logging in a distributed script not guarded by a rank-0 check",
         "logging.info on every rank repeats each record N times. Guard it, or include the "
         "rank in the message or format (splitsync's run.logger does). Known false "
         "positives: loggers whose handlers are disabled on other ranks by configuration "
         "the checker cannot see.", unguarded_logging),
    Rule("SS504", "save-per-node", "warning",
         "checkpoint written under local_rank == 0 (one writer per machine)",
         "LOCAL_RANK is the process's index on its own machine, so `local_rank == 0` is true "
         "on one process per node: on N nodes N processes write the same checkpoint path, "
         "which a shared filesystem interleaves or truncates. Guard writes by the global "
         "rank. Known false positives: single-node jobs (local and global rank agree) and "
         "paths on node-local disks where one copy per machine is intended.", save_per_node),
    Rule("SS505", "every-rank-writes-file", "warning",
         "a file truncated (open(path, 'w')) or a tree copied on every rank of a distributed run",
         "Writing one path from every process races: `open(path, 'w')` truncates what another "
         "rank is writing, `shutil.copytree` copies over another rank's half-done copy. Do it "
         "once on rank 0 and barrier, or name the file after the rank. Known false positives: "
         "paths on node-local or per-process scratch space the checker cannot tell apart.",
         shared_file_writes),
)
