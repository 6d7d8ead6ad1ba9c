"""Output that every rank repeats: print (SS501) and logging (SS503) in a distributed script,
outside a rank-0 check. Files every rank writes are in :mod:`splitsync.check.rules.writes`,
a print override that forgets the rank in :mod:`splitsync.check.rules.overrides`."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.everyrank import every_rank, guard_text, names_rank
from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.flow import mentions_rank
from splitsync.check.model import Hit, Rule
from splitsync.check.ranks import rank_in

__all__ = ["RULES"]


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
            if rest and (isinstance(rest[0], ast.Raise) or (
                    isinstance(rest[0], ast.Return) and _ends_process(facts, rest[0])) or (
                    isinstance(rest[0], ast.Expr) and last_name(rest[0].value) in {
                        "exit", "_exit", "quit"})):
                return True
    return False


def _ends_process(facts: Facts, stmt: ast.Return) -> bool:
    """Does returning here end the process: a return from the script's entry function
    (``main()``, called by code that runs on import), not from a helper that carries on?"""
    scope = facts.scope(stmt)
    return not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) or (
        scope.name in facts.project.entry)


_OPT_IN = re.compile(r"verbose|debug|^print_|_print$|^show_", re.I)


def _opt_in(facts: Facts, call: ast.Call) -> bool:
    """``if self.print_text: print(...)``: diagnostics the user switches on for a debug run."""
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.If) and any(
                _OPT_IN.search(last_name(n) or "") for n in ast.walk(parent.test)
                if isinstance(n, ast.Name | ast.Attribute)):
            return True
    return False


_BARS = frozenset({"tqdm", "trange"})
_BARRIERS = frozenset({"barrier", "wait_for_everyone", "Barrier", "monitored_barrier"})


def _serialised(facts: Facts, call: ast.Call) -> bool:
    """``for r in range(world_size): if rank == r: print(...); dist.barrier()``: the ranks
    take turns, each printing its own line once, on purpose."""
    turn = False
    for parent in facts.ancestors(call):
        if isinstance(parent, ast.If) and rank_in(facts, parent.test):
            turn = True
        if isinstance(parent, ast.For | ast.While | ast.AsyncFor):
            return turn and any(last_name(c) in _BARRIERS for c in facts.inside(parent, ast.Call))
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            return False
    return False


def _progress_bars(facts: Facts) -> Iterator[Hit]:
    """``tqdm(loader)`` on every rank: one bar per process, redrawn over each other."""
    cache: dict[int, set[str]] = {}
    for call in facts.named_calls(*_BARS):
        if not (facts.resolve(call.func) or "").startswith(("tqdm", "trange")) \
                or not every_rank(facts, call):
            continue
        if any(k.arg in {"disable", "position"} for k in call.keywords) \
                or names_rank(facts, call, cache):
            continue  # switched off off rank 0 (`disable=rank != 0`), or one line per rank
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} draws a progress bar on "
                  "every rank: N processes redraw N bars over each other on one terminal.",
                  "draw it on rank 0 only: `tqdm(..., disable=dist.get_rank() != 0)` "
                  "(`disable=not accelerator.is_main_process` under Accelerate).")


def unguarded_print(facts: Facts) -> Iterator[Hit]:
    """SS501: ``print`` (and ``tqdm`` progress bars) on every rank."""
    yield from _progress_bars(facts)
    if "print" in facts.functions or facts.project.print_override:
        return  # print is replaced by a rank-0-only one (`setup_for_distributed(is_master)`)
    cache: dict[int, set[str]] = {}
    for call, full in facts.calls:
        if full != "print" or not isinstance(call.func, ast.Name) or not every_rank(facts, call):
            continue
        if names_rank(facts, call, cache) or _before_exit(facts, call) or _opt_in(facts, call) \
                or _serialised(facts, call):
            continue  # names its rank, says why the process stops, is opted into, takes turns
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
               else f"print under {guard_text(facts)}, or put the rank in the message if every "
               "process should report")
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} runs on every rank: with "
                  "N processes the line appears N times, interleaved.", f"{fix}.")

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
        if name not in loggers or not every_rank(facts, call):
            continue
        if mentions_rank([*call.args, *call.keywords], facts):
            continue
        alt = " or `run.logger`, whose lines carry the rank" if facts.is_splitsync else ""
        yield Hit(call, f"`{facts.text(call)}` {facts.scope_name(call)} logs on every rank: each "
                  "record is written N times with nothing telling the copies apart.",
                  f"log under {guard_text(facts)}, or put the rank in the format{alt}.")


RULES = (
    Rule("SS501", "unguarded-print", "info",
         "print (or a tqdm progress bar) in a distributed script not guarded by a rank-0 check",
         "Every process runs the whole script; output meant once must be guarded by a rank-0 "
         "check (splitsync: run.print); a tqdm bar on every rank draws N bars over each other "
         "unless `disable=` switches it off elsewhere. Prints in functions the project never "
         "reaches on every rank (only under a rank-0 check, or never) are not reported. A "
         "print that names its rank (or a value computed from "
         "it) is treated as deliberate, and no print is flagged when the project replaces "
         "builtins.print with a rank-0-only one (`setup_for_distributed(is_master)`). Known "
         "false positives: print replaced by other means (a logging redirect, a wrapper "
         "module the checker cannot read).", unguarded_print),
    Rule("SS503", "unguarded-logging", "info",
         "logging in a distributed script not guarded by a rank-0 check",
         "logging.info on every rank repeats each record N times. Guard it, or include the "
         "rank in the message or format (splitsync's run.logger does). Known false "
         "positives: loggers whose handlers are disabled on other ranks by configuration "
         "the checker cannot see.", unguarded_logging),
)
