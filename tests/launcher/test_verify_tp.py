"""`splitsync verify` on a tensor-parallel script (init(mesh=...)): the one-process
reference runs the model whole, the TP groups are checked to agree, and a gradient not
reduced over the TP group is named by its layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitsync.tools.verify.script import verify_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "verify_scripts" / "tp_gain.py"


def test_a_tp_run_trains_like_one_process() -> None:
    report = verify_script(str(SCRIPT), [], 2, steps=2, epochs=1, timeout=240)
    assert all(r.ok for r in report.results), report.results
    checks = {r.check for r in report.results}
    assert {"TP groups of 2 agree", "final weights by layer", "per-step loss"} <= checks


def test_a_gradient_not_reduced_over_tp_is_named_by_its_layer() -> None:
    report = verify_script(str(SCRIPT), ["--fault"], 2, steps=1, epochs=1, timeout=240)
    failed = {r.check: r.detail for r in report.results if not r.ok}
    assert "final weights by layer" in failed, report.results
    assert failed["final weights by layer"].startswith("layer block differs: block.gain")


@pytest.mark.extended
def test_tp_2_by_dp_shard_2_at_4_ranks_names_the_layer_too() -> None:
    good = verify_script(str(SCRIPT), [], 4, steps=1, epochs=1, timeout=240)
    assert all(r.ok for r in good.results), good.results
    bad = verify_script(str(SCRIPT), ["--fault"], 4, steps=1, epochs=1, timeout=240)
    failed = {r.check: r.detail for r in bad.results if not r.ok}
    assert set(failed) == {"final weights by layer"}, bad.results
    assert failed["final weights by layer"].startswith("layer block differs: block.gain")
