"""The severity gate: a rule is shown at the severity its findings on the labelled corpus earn.

Each rule declares a severity (a ceiling, never raised). The corpus of public training code
(``benchmarks/check_corpus/``) measures how often the rule's findings at that level are
right, and the gate reads that measurement with a confidence interval rather than a raw
ratio, so a handful of findings decides nothing:

- ``warning`` stays ``warning`` unless the corpus shows the rule is wrong too often: with at
  least :data:`MIN_FINDINGS` findings, the 95% Wilson interval of its precision lies wholly
  below :data:`MIN_PRECISION` (its upper bound is below 95%). Then it reports ``info``.
- ``error`` needs proof: at least :data:`MIN_FINDINGS` findings on the corpus, none of them
  false (otherwise ``warning``).

Why the upper bound: a warning must be right at least 95% of the time, and the interval says
where the precision can still be. A rule with 3 right and 1 wrong finding (75%) may well be
a 95% rule (its interval reaches 95.4%), so one finding does not demote it; a rule with 66
right of 97 (68%, interval 58-76%) is shown to be below the bar. A lower-bound test (warning
only once the interval is above 90%) would need 35 findings, all right, before any rule could
warn, and would silence the rare mistakes (a DDP loader without a sampler) for good.
"""

from __future__ import annotations

from math import sqrt

from splitsync.check.measured import MEASURED

__all__ = ["MIN_PRECISION", "MIN_FINDINGS", "Z", "wilson", "gate", "earned", "measured_text"]

#: A warning must be right this often; a rule shown to fall short reports at most `info`.
MIN_PRECISION = 0.95
#: Fewer findings than this on the corpus never demote a rule (too few to measure it), and
#: never prove an `error`.
MIN_FINDINGS = 3
#: Two-sided 95% normal quantile of the Wilson score interval.
Z = 1.959964


def wilson(true: int, total: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of ``true / total`` (``(0.0, 1.0)`` for no findings)."""
    if total <= 0:
        return 0.0, 1.0
    p = true / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    margin = z * sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return max(0.0, centre - margin), min(1.0, centre + margin)


def gate(code: str, declared: str) -> tuple[str, str]:
    """The severity a rule may use given its findings on the corpus, and why (empty when
    the declared severity stands). ``declared`` is a ceiling, never raised."""
    true, false, _, _ = MEASURED.get(code, (0, 0, 0, 0))
    return earned(true, false, declared)


def earned(true: int, false: int, declared: str) -> tuple[str, str]:
    """The severity ``true`` right and ``false`` wrong findings earn a rule declared at
    ``declared``, and why (empty when the declared severity stands)."""
    total = true + false
    if declared == "info":
        return "info", ""
    if total >= MIN_FINDINGS:
        low, high = wilson(true, total)
        if high < MIN_PRECISION:
            return "info", (f"measured precision {true}/{total} = {true / total:.0%} (95% "
                            f"interval {low:.0%}-{high:.0%}) is below {MIN_PRECISION:.0%}")
    if declared == "error" and (false or total < MIN_FINDINGS):
        why = (f"{false} false positive(s) on the corpus" if false
               else f"{total} finding(s) on the corpus, fewer than {MIN_FINDINGS}")
        return "warning", f"error needs proof: {why}"
    return declared, ""


def measured_text(code: str) -> str:
    """One line on the rule's measured precision, for ``--explain`` and ``--list-rules``."""
    true, false, held_true, held_false = MEASURED.get(code, (0, 0, 0, 0))
    total = true + false
    if not total:
        return "not measured: no finding on the labelled corpus of public training code."
    low, high = wilson(true, total)
    held = held_true + held_false
    part = (f"; held-out part {held_true}/{held} = {held_true / held:.0%}" if held else "")
    return (f"measured on the labelled corpus of public training code: {true} of {total} "
            f"findings right = {true / total:.0%} (95% interval {low:.0%}-{high:.0%}){part}.")
