"""Output that every rank repeats: print (SS501), torch.save (SS502) and logging (SS503)
in a distributed script, outside a rank-0 check."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.lint.facts import Facts, dotted, last_name
from splitsync.lint.flow import guarded_by_rank0, mentions_rank
from splitsync.lint.model import Hit, Rule

__all__ = ["RULES"]



def _every_rank(facts: Facts, call: ast.Call) -> bool:
    """Does ``call`` run on every rank of a distributed script?"""
    if not facts.is_distributed or guarded_by_rank0(facts, call):
        return False
    main = facts.main_block()
    if facts.uses_spawn and main is not None and any(a is main for a in facts.ancestors(call)):
        return False  # spawned children never run the parent's __main__ block
    return True


def _guard(facts: Facts) -> str:
    if facts.is_splitsync:
        return "`if run.is_main:`"
    return "`if rank == 0:` (or `dist.get_rank() == 0`)"


def unguarded_print(facts: Facts) -> Iterator[Hit]:
    """SS501: ``print`` on every rank."""
    if "print" in facts.functions:
        return
    for call, full in facts.calls:
        if full != "print" or not isinstance(call.func, ast.Name) or not _every_rank(facts, call):
            continue
        if mentions_rank([*call.args, *call.keywords]):
            continue  # the line names its rank: deliberately per-process output
        fix = ("use `run.print(...)`, which prints on rank 0 only" if facts.is_splitsync
               else f"print under {_guard(facts)}, or put the rank in the message if every "
               "process should report")
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} runs on every rank: with "
                  "N processes the line appears N times, interleaved.", f"{fix}.")


def _buffers(facts: Facts) -> set[str]:
    """Names bound to in-memory buffers (``io.BytesIO()``): saving there writes no file."""
    names: set[str] = set()
    for node in facts.nodes:
        if isinstance(node, ast.Assign):
            value, targets = node.value, node.targets
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            value, targets = node.context_expr, [node.optional_vars]
        else:
            continue
        if isinstance(value, ast.Call) and last_name(value) == "BytesIO":
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def unguarded_save(facts: Facts) -> Iterator[Hit]:
    """SS502: ``torch.save`` on every rank."""
    buffers = _buffers(facts)
    for call in facts.calls:
        c = call[0]
        if call[1] != "torch.save" or not _every_rank(facts, c):
            continue
        target = c.args[1] if len(c.args) > 1 else next(
            (k.value for k in c.keywords if k.arg == "f"), None)
        if target is not None and (mentions_rank([target]) or dotted(target) in buffers
                                   or last_name(target) == "BytesIO"):
            continue  # one file per rank on purpose, or memory rather than a file
        what = f"`{facts.text(target, 200)}`" if target is not None else "the file"
        yield Hit(c, f"`{facts.text(c)}` {facts.scope_name(c)} runs on every rank: N processes "
                  f"write {what} at the same time, which can leave it truncated or mixed, and "
                  "N-1 of the writes are wasted.",
                  f"save under {_guard(facts)}, then `dist.barrier()` before any rank reads it "
                  "back (`run.barrier()` in splitsync).")


def _loggers(facts: Facts) -> set[str]:
    names = {"logging"}
    for node in facts.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and facts.resolve(node.value.func) == "logging.getLogger":
            names.update(d for t in node.targets if (d := dotted(t)))
    return names


def unguarded_logging(facts: Facts) -> Iterator[Hit]:
    """SS503: ``logger.info`` on every rank."""
    loggers = _loggers(facts)
    for call in facts.method_calls("info"):
        receiver = call.func.value  # type: ignore[attr-defined]
        name = "logging" if facts.resolve(receiver) == "logging" else dotted(receiver)
        if name not in loggers or not _every_rank(facts, call):
            continue
        if mentions_rank([*call.args, *call.keywords]):
            continue
        alt = " or `run.logger`, whose lines carry the rank" if facts.is_splitsync else ""
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} logs on every rank: each "
                  "record is written N times with nothing telling the copies apart.",
                  f"log under {_guard(facts)}, or put the rank in the format{alt}.")


RULES = (
    Rule("SS501", "unguarded-print", "warning",
         "print in a distributed script not guarded by a rank-0 check",
         "Every process runs the whole script; output meant once must be guarded by a rank-0 "
         "check (splitsync: run.print). A print that names its rank is treated as deliberate.",
         unguarded_print),
    Rule("SS502", "unguarded-save", "warning",
         "torch.save in a distributed script not guarded by a rank-0 check",
         "Concurrent writers of one checkpoint file can corrupt it; save on rank 0 and barrier. "
         "Paths that contain the rank (one file per rank) are allowed.", unguarded_save),
    Rule("SS503", "unguarded-logging", "warning",
         "logging in a distributed script not guarded by a rank-0 check",
         "logging.info on every rank repeats each record N times. Guard it, or include the "
         "rank in the message or format (splitsync's run.logger does).", unguarded_logging),
)
