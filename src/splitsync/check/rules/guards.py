"""A rank guard that ``and``/``or`` precedence defeats (SS211): ``if is_main and force or
ask_user():`` reads as ``(is_main and force) or ask_user()``, so every rank whose
``ask_user()`` is true runs the block meant for rank 0 (every rank prompts on stdin, every
rank deletes the shared folder)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.facts import Facts
from splitsync.check.flow import rank0_test
from splitsync.check.model import Hit, Rule
from splitsync.check.ranks import rank_in

__all__ = ["RULES"]


def _rank_part(facts: Facts, expr: ast.AST) -> bool:
    return rank0_test(expr) or rank_in(facts, expr)


def guard_precedence(facts: Facts) -> Iterator[Hit]:
    """SS211: ``if <rank test> and x or y:`` where ``y`` does not test the rank."""
    if not facts.in_distributed_run:
        return
    for node in facts.of(ast.If, ast.IfExp, ast.While):
        test = node.test  # type: ignore[attr-defined]
        if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)):
            continue
        first, rest = test.values[0], test.values[1:]
        if not (isinstance(first, ast.BoolOp) and isinstance(first.op, ast.And)
                and any(_rank_part(facts, v) for v in first.values)):
            continue
        loose = [v for v in rest if not _rank_part(facts, v)]
        if not loose:
            continue
        guard = next(v for v in first.values if _rank_part(facts, v))
        yield Hit(test, f"`{facts.text(test, 80)}` reads as `({facts.text(first, 60)}) or "
                  f"{facts.text(loose[0], 40)}`: `and` binds tighter than `or`, so the rank test "
                  f"`{facts.text(guard, 40)}` does not guard `{facts.text(loose[0], 40)}`, and every "
                  "rank where it is true runs this block (prompts, deletes, writes) as if it "
                  "were rank 0.",
                  f"bracket what the rank test must guard: `{facts.text(guard, 40)} and "
                  f"(... or {facts.text(loose[0], 40)})`.")


RULES = (
    Rule("SS211", "rank-guard-precedence", "error",
         "a rank-0 test joined by `and` and then `or`, which leaves the `or` side unguarded",
         "`if is_main and force or ask_user():` is `(is_main and force) or ask_user()`. On "
         "every rank `ask_user()` runs (each prompts on stdin, most hang there), and wherever "
         "it is true the block meant for rank 0 runs on that rank too: a shared folder deleted "
         "N times, a file written N times. Known false positives: an `or` side that is itself "
         "a rank test the checker does not recognise.", guard_precedence),
)
