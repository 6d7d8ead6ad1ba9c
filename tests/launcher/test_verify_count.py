"""`splitsync verify` on a ragged-batch language model: without count= the 1-process and
2-process steps differ and the likely cause names the token mean; with count= they agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitsync.tools.verify.script import verify_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RAGGED = Path(__file__).parent / "verify_scripts" / "ragged.py"


def test_the_mean_of_means_is_named_as_the_cause() -> None:
    report = verify_script(str(RAGGED), [], 2, steps=3, epochs=1, timeout=240)
    failed = {r.check for r in report.results if not r.ok}
    assert "per-step loss" in failed, report.results
    assert report.cause is not None and report.cause.startswith("ragged.py:")
    assert "run.backward(loss, count=n)" in report.cause and "mean over every token" in report.cause


def test_with_count_one_and_two_processes_agree() -> None:
    report = verify_script(str(RAGGED), ["--count"], 2, steps=3, epochs=1, timeout=240)
    assert all(r.ok for r in report.results), report.results
    assert report.cause is None
