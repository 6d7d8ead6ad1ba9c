"""Every rule, in code order, and code selection (``--select`` / ``--ignore``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from splitsync.check.gating import MIN_PRECISION, gate, measured_text
from splitsync.check.model import SEVERITIES, Rule
from splitsync.check.rules import (
    collectives,
    cpuwrap,
    data,
    devices,
    drift,
    guards,
    indices,
    loop,
    metrics,
    moves,
    output,
    overrides,
    padding,
    parallel,
    paths,
    placement,
    seeds,
    setup,
    tensor,
    tokens,
    wrappers,
    writes,
)

__all__ = ["RULE_MODULES", "all_rules", "get_rule", "select_rules", "gate", "measured_text",
           "META_CODES", "META_HELP", "MIN_PRECISION"]

#: Every module of ``splitsync.check.rules`` that defines rules, each listing its own in
#: ``RULES`` (docs/check.md maps each code to its module).
RULE_MODULES = (devices, moves, indices, placement, parallel, cpuwrap, collectives, drift,
                wrappers, guards, setup, data, padding, seeds, output, writes, metrics, overrides, paths, loop,
                tokens, tensor)

#: Codes the runner itself reports: a file that does not parse, a bad suppression comment,
#: a rule that crashed on a file, an imported module of the project it could not read.
META_CODES = {"SS000": "syntax-error", "SS001": "bad-suppression", "SS002": "rule-failed",
              "SS003": "not-read"}
#: (severity, what it means) of each runner code, for ``--list-rules``.
META_HELP = {
    "SS000": ("error", "the file cannot be read or parsed as Python; no rule ran on it"),
    "SS001": ("warning", "a `# splitsync: ignore[...]` comment names no rule"),
    "SS002": ("warning", "a rule failed on this file (the other rules still ran)"),
    "SS003": ("info", "an imported module of the project that could not be read (listed once "
                      "per run; rules do not claim what depends on it)"),
}


def _gated(rule: Rule) -> Rule:
    severity, _ = gate(rule.code, rule.severity)
    if SEVERITIES.index(severity) <= SEVERITIES.index(rule.severity):
        return rule
    return replace(rule, severity=severity)


def all_rules(gated: bool = True) -> tuple[Rule, ...]:
    """All rules, sorted by code; ``gated`` caps each severity by its measured precision."""
    rules = tuple(rule for module in RULE_MODULES for rule in module.RULES)
    if gated:
        rules = tuple(_gated(r) for r in rules)
    return tuple(sorted(rules, key=lambda r: r.code))


def get_rule(code: str, gated: bool = True) -> Rule:
    """The rule with ``code`` (case-insensitive); KeyError naming the known codes otherwise."""
    for rule in all_rules(gated):
        if rule.code == code.upper():
            return rule
    raise KeyError(f"no rule {code!r}; known codes: {', '.join(r.code for r in all_rules())}")


def _matches(code: str, prefixes: Iterable[str]) -> bool:
    return any(code.startswith(p) for p in prefixes)


def _validate(prefixes: list[str], flag: str) -> None:
    codes = [r.code for r in all_rules()] + list(META_CODES)
    for p in prefixes:
        if not any(c.startswith(p) for c in codes):
            raise ValueError(f"{flag} {p!r} matches no rule; codes are {', '.join(codes)} "
                             "(a prefix such as SS5 selects SS501-SS503)")


def select_rules(select: Iterable[str] | None = None,
                 ignore: Iterable[str] | None = None, gated: bool = True) -> tuple[Rule, ...]:
    """Rules whose code starts with one of ``select`` (all if None) and none of ``ignore``
    (``gated``: severities capped by measured precision, as ``splitsync check`` reports)."""
    chosen = [p.strip().upper() for p in select or [] if p.strip()]
    dropped = [p.strip().upper() for p in ignore or [] if p.strip()]
    _validate(chosen, "--select")
    _validate(dropped, "--ignore")
    return tuple(r for r in all_rules(gated)
                 if (not chosen or _matches(r.code, chosen)) and not _matches(r.code, dropped))
