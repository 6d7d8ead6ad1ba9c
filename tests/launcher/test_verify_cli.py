"""`splitsync verify` end to end: the self-test and the script check, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "verify_scripts" / "classify.py"


def _verify(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "splitsync", "verify", *args], env=env,
                          capture_output=True, text=True, timeout=240)


def test_selftest_passes_with_two_processes() -> None:
    out = _verify("-n", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    for row in ("collectives on gloo (2 processes)", "train 1 vs 2 processes",
                "checkpoint round trip (2 processes)"):
        assert row in out.stdout
    assert "FAIL" not in out.stdout and "all checks passed" in out.stdout


def test_selftest_fails_loudly_on_a_bad_backend() -> None:
    out = _verify("-n", "2", "--backend", "gloo", "--backend", "nosuchbackend")
    assert out.returncode == 1
    line = next(x for x in out.stdout.splitlines() if "collectives on nosuchbackend" in x)
    assert "FAIL" in line and "nosuchbackend" in line
    assert "verify FAILED" in out.stdout


def test_correct_script_passes() -> None:
    out = _verify("-n", "2", str(SCRIPT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout


def test_summed_loss_is_reported_with_its_cause() -> None:
    out = _verify("-n", "2", str(SCRIPT), "--reduction", "sum")
    assert out.returncode == 1
    assert "per-step loss" in out.stdout and "first differs at step 0" in out.stdout
    assert "likely cause: The loss is summed over the batch" in out.stdout


def test_unsharded_plain_dataloader_is_reported_with_its_cause() -> None:
    out = _verify("-n", "2", str(SCRIPT), "--plain-loader")
    assert out.returncode == 1
    line = next(x for x in out.stdout.splitlines() if "ranks' samples disjoint" in x)
    assert "FAIL" in line
    assert "likely cause: Unsharded data" in out.stdout
