"""Severities earn their level: each rule's severity is capped by its precision measured on
the labelled corpus of public training code (the table benchmarks/check_precision.py
generates), and `splitsync check --explain` quotes that precision."""

from __future__ import annotations

import argparse

import pytest

from splitsync.check.gating import MIN_FINDINGS, earned, wilson
from splitsync.check.measured import CORPUS, MEASURED
from splitsync.check.registry import MIN_PRECISION, all_rules, gate, get_rule
from splitsync.commands import check as check_command


def test_the_measured_table_covers_a_broad_corpus() -> None:
    files, repos = CORPUS
    assert files >= 150 and repos >= 40
    assert {r.code for r in all_rules()} <= set(MEASURED)
    assert sum(t + f for t, f, _, _ in MEASURED.values()) > 300


def test_gate_caps_by_measured_precision() -> None:
    # a rule shown (with enough findings) to be below 95% reports at most info; error needs
    # enough findings on the corpus and no false positive
    for code, (true, false, _, _) in MEASURED.items():
        declared = get_rule(code, gated=False).severity
        shown = get_rule(code).severity
        total = true + false
        if declared != "info" and total >= MIN_FINDINGS and wilson(true, total)[1] < MIN_PRECISION:
            assert shown == "info", code
        elif declared == "error" and (false or total < MIN_FINDINGS):
            assert shown == "warning", code
        else:
            assert shown == declared, code


def test_gate_reads_a_confidence_bound_not_a_raw_ratio() -> None:
    # the case: 3 right and 1 wrong (75%) may still be a 95% rule; one finding
    # does not decide the severity of the lesson's own mistake
    assert earned(3, 1, "warning") == ("warning", "")
    assert earned(0, 2, "warning") == ("warning", "")  # fewer than MIN_FINDINGS: unmeasured
    level, why = earned(66, 31, "warning")  # 68%, interval 58-76%: shown to fall short
    assert level == "info" and "66/97" in why and "interval" in why
    assert earned(40, 0, "error") == ("error", "")
    assert earned(40, 1, "error")[0] == "warning"  # one false positive: no error
    assert earned(MIN_FINDINGS - 1, 0, "error")[0] == "warning"  # too few to prove it
    low, high = wilson(3, 4)
    assert low < 0.75 < 0.95 < high
    assert wilson(0, 0) == (0.0, 1.0)


def test_gate_rules_of_thumb() -> None:
    assert gate("SS000-not-a-rule", "warning") == ("warning", "")
    assert gate("SS000-not-a-rule", "error")[0] == "warning"  # unmeasured is not proven
    assert gate("SS000-not-a-rule", "info")[0] == "info"


def test_explain_shows_measured_precision_and_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    capped = next(r.code for r in all_rules() if r.severity != get_rule(r.code, gated=False).severity)
    args = argparse.Namespace(select="", ignore="", list_rules=False, json=False, explain=capped,
                              paths=[], fail_on="error")
    assert check_command.main(args) == 0
    out = capsys.readouterr().out
    true, false, _, _ = MEASURED[capped]
    if true + false:
        assert f"{true} of {true + false} findings right" in out
    assert f"{capped} " in out and "declared" in out
