"""Severities earn their level: each rule's severity is capped by its precision measured on
the labelled corpus of public training code (the table benchmarks/check_precision.py
generates), and `splitsync check --explain` quotes that precision."""

from __future__ import annotations

import argparse

import pytest

from splitsync.check.measured import CORPUS, MEASURED
from splitsync.check.registry import MIN_PRECISION, all_rules, gate, get_rule
from splitsync.commands import check as check_command


def test_the_measured_table_covers_a_broad_corpus() -> None:
    files, repos = CORPUS
    assert files >= 150 and repos >= 40
    assert {r.code for r in all_rules()} <= set(MEASURED)
    assert sum(t + f for t, f, _, _ in MEASURED.values()) > 300


def test_gate_caps_by_measured_precision() -> None:
    # the rules below 95% on the corpus report at most info; error needs no false positive
    for code, (true, false, _, _) in MEASURED.items():
        declared = get_rule(code, gated=False).severity
        shown = get_rule(code).severity
        if true + false and true / (true + false) < MIN_PRECISION:
            assert shown == "info", code
        elif declared == "error" and (false or not true):
            assert shown == "warning", code
        else:
            assert shown == declared, code


def test_gate_rules_of_thumb() -> None:
    assert gate("SS000-not-a-rule", "warning") == ("warning", "")
    assert gate("SS000-not-a-rule", "error")[0] == "warning"  # unmeasured is not proven
    assert gate("SS000-not-a-rule", "info")[0] == "info"


def test_explain_shows_measured_precision(capsys: pytest.CaptureFixture[str]) -> None:
    low = next(c for c, (t, f, _, _) in MEASURED.items() if t + f and t / (t + f) < 0.95)
    args = argparse.Namespace(select="", ignore="", list_rules=False, json=False, explain=low,
                              paths=[], fail_on="error")
    assert check_command.main(args) == 0
    out = capsys.readouterr().out
    true, false, _, _ = MEASURED[low]
    assert f"{true} of {true + false} findings right" in out
    assert f"{low} " in out and "(info)" in out and "declared" in out
