"""Files every rank writes: torch.save (SS502) outside a rank-0 check, checkpoints written once
per machine (SS504), files truncated or trees copied on every rank (SS505), and a run folder
every rank picks for itself (SS509)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.everyrank import (
    every_rank,
    guard_text,
    names_rank,
    rank_derived,
    under_lock,
)
from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.flow import (
    is_local_rank_test,
    local_rank_names,
    mentions_rank,
    rank0_guards,
)
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]


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
    cache: dict[int, set[str]] = {}
    for c, full in facts.calls:
        if full not in _SAVERS:
            continue
        target = c.args[1] if len(c.args) > 1 else next(
            (k.value for k in c.keywords if k.arg in {"f", "filename"}), None)
        if target is not None and (mentions_rank([target], facts) or dotted(target) in buffers
                                   or last_name(target) == "BytesIO"):
            continue
        if target is not None and _per_process_path(facts, c, target, cache):
            continue  # `queue_path = ... "queue" + str(rank) + ".pth"`: one file per rank
        yield c, target


def _per_process_path(facts: Facts, call: ast.Call, target: ast.AST,
                      cache: dict[int, set[str]]) -> bool:
    """Is ``target`` a name computed from the rank (or a value unique per process) in the
    function that saves?"""
    scope = facts.scope(call)
    if id(scope) not in cache:
        cache[id(scope)] = rank_derived(facts, scope, unique=True)
    return any(isinstance(n, ast.Name) and n.id in cache[id(scope)]
               for n in facts.subtree(target))


def unguarded_save(facts: Facts) -> Iterator[Hit]:
    """SS502: ``torch.save`` on every rank."""
    for c, target in _saves(facts):
        if not every_rank(facts, c) or under_lock(facts, c):
            continue  # not on every rank, or the processes take turns under a file lock
        what = f"`{facts.text(target, 200)}`" if target is not None else "the file"
        yield Hit(c, f"`{facts.text(c)}` {facts.scope_name(c)} runs on every rank: N processes "
                  f"write {what} at the same time, which can leave it truncated or mixed, and "
                  "N-1 of the writes are wasted.",
                  f"save under {guard_text(facts)}, then `dist.barrier()` before any rank reads it "
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
        fix = ("guard checkpoint writes by the global rank, `if dist.get_rank() == 0:` "
               "(`int(os.environ[\"RANK\"]) == 0` under torchrun; `run.is_main` in "
               "splitsync), and `dist.barrier()` before any rank reads the file.")
        if facts.scope(guards[0]) is not facts.scope(c):
            # the guard is at the caller of the helper that saves: the line to change
            for guard in guards:
                yield Hit(guard, f"`{test}` is the rank within one machine, and it guards a "
                          f"call that writes {what} with `{facts.text(c)}` (line {c.lineno}, "
                          f"{facts.scope_name(c)}): on a multi-node run one process per node "
                          "writes the same file on a shared filesystem at once.", fix)
            continue
        yield Hit(c, f"`{facts.text(c)}` is guarded by `{test}`, the rank within one machine: "
                  f"on a multi-node run one process per node writes {what}, so several "
                  "processes write the same file on a shared filesystem at once.", fix)

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
        if target is None or mentions_rank([target], facts) or not every_rank(facts, call) \
                or under_lock(facts, call):
            continue
        if names_rank(facts, call, {}, unique=True):
            continue  # the path is built from the rank: one file per process
        what = "copies or removes files" if tree else "truncates and writes"
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} runs on every rank and "
                  f"{what} `{facts.text(target, 80)}`: N processes race on the same path, so "
                  "the file can end up truncated, interleaved or half-copied.",
                  f"do it once, under {guard_text(facts)}, then `dist.barrier()` before any rank "
                  "reads it; or put the rank in the path if every process needs its own.")


#: Helpers that pick a fresh run folder by looking at what exists (`runs/exp3` after
#: `runs/exp2`): ultralytics' `increment_path` and its kin.
_RUN_FOLDERS = re.compile(r"^(increment_(path|dir)|get_(next|new|unique)_(run|exp|log)_?dir|"
                          r"next_run_dir|make_run_dir|unique_(run|exp)_?dir)$", re.I)


def _exist_ok(call: ast.Call) -> bool:
    value = next((k.value for k in call.keywords if k.arg == "exist_ok"), None)
    return value is not None and not (isinstance(value, ast.Constant) and not value.value)


def _checked_first(facts: Facts, call: ast.Call) -> ast.If | None:
    """``if not os.path.exists(p): os.mkdir(p)``: the test every rank passes at once."""
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.If) and any(
                last_name(n) in {"exists", "isdir"} for n in facts.inside(parent.test, ast.Call)):
            return parent
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            return None
    return None


def run_folder_per_rank(facts: Facts) -> Iterator[Hit]:
    """SS509: every rank picks its own run folder, or races to create one. The folder is the
    training script's choice: a helper module's own folder picking (an inference API's
    `save()`) is not the run folder."""
    if not facts.in_distributed_run:
        return
    names = [n for n in facts.call_names() if _RUN_FOLDERS.match(n)] + ["mkdir", "makedirs"]
    for call in facts.named_calls(*names):
        name = last_name(call) or ""
        full = facts.resolve(call.func) or ""
        if _RUN_FOLDERS.match(name) and facts.is_distributed and every_rank(facts, call) \
                and not names_rank(facts, call, {}, unique=True):
            yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} runs on every rank: "
                      "each process looks for the next free run folder itself, so a rank "
                      "that looks after another has created `exp<N>` picks `exp<N+1>`, and "
                      "the ranks write their logs and checkpoints into different folders.",
                      f"pick the folder once, under {guard_text(facts)}, and send it to the "
                      "other ranks (`dist.broadcast_object_list([path], src=0)`), or derive "
                      "it from a name every rank knows (a job id) instead of what exists.")
        elif full in {"os.mkdir", "os.makedirs"} and not _exist_ok(call) \
                and (test := _checked_first(facts, call)) is not None \
                and every_rank(facts, call) and not names_rank(facts, call, {}, unique=True):
            yield Hit(call, f"`{facts.text(call)}` runs on every rank after "
                      f"`{facts.text(test.test, 60)}`: all ranks see the folder missing, "
                      "the first creates it and the others fail with FileExistsError.",
                      "create it with `os.makedirs(path, exist_ok=True)` (safe on every "
                      f"rank), or once under {guard_text(facts)} followed by `dist.barrier()`.")


RULES = (
    Rule("SS502", "unguarded-save", "warning",
         "torch.save in a distributed script not guarded by a rank-0 check",
         "Concurrent writers of one checkpoint file can corrupt it; save on rank 0 and barrier. "
         "Paths that contain the rank (one file per rank) are allowed. Known false positives: a "
         "helper that is only ever called on rank 0 from another project the checker does not "
         "read; saves to node-local scratch disks meant per process.", unguarded_save),
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
    Rule("SS509", "run-folder-per-rank", "warning",
         "every rank picks its own run folder (increment_path) or races to mkdir it",
         "Run folders named after what already exists (ultralytics' `increment_path`: "
         "`runs/exp2` when `runs/exp1` is taken) must be chosen once: chosen on every rank, "
         "a rank that looks after another created the folder picks the next name, and the "
         "ranks write into different folders. Likewise `if not os.path.exists(d): "
         "os.mkdir(d)` on every rank: all ranks pass the test, one creates the folder, the "
         "others raise FileExistsError. Known false positives: a helper of that name that "
         "only formats a path; folders on node-local disks.", run_folder_per_rank),
)
