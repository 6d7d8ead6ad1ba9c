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


PLAIN_DDP = Path(__file__).parent / "verify_scripts" / "plain_ddp.py"


def _verify_in(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "splitsync", "verify", *args], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=240)


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1)
                  for p in root.rglob("*"))


def _cause(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 1, out.stdout + out.stderr
    assert "verify FAILED" in out.stdout
    text = " ".join(out.stdout.split())  # rich wraps long lines
    return text[text.index("likely cause:"):]


# --- one faulty script per cause ----------------------------------------------------------
@pytest.mark.parametrize(("flags", "cause", "failed_row"), [
    (["--dropout", "0.5"], "Dropout draws different masks", "per-step loss"),
    (["--batchnorm"], "BatchNorm normalises each rank's B/N samples", "per-step loss"),
    (["--no-set-epoch"], "The sampler's epoch never advances", "set_epoch advanced"),
    (["--world-seed"], "initial weights depend on the number of processes",
     "initial weights: 1 vs 2 processes"),
    (["--lr-by-world"], "learning rate and batch size do not depend on world_size",
     "per-step gradient norm"),
])
def test_each_fault_is_reported_with_its_own_cause(flags: list[str], cause: str,
                                                   failed_row: str) -> None:
    out = _verify("-n", "2", str(SCRIPT), *flags)
    assert cause in _cause(out), out.stdout
    line = next(x for x in out.stdout.splitlines() if failed_row in x)
    assert "FAIL" in line


def test_dropout_is_not_blamed_when_only_set_epoch_is_wrong() -> None:
    out = _verify("-n", "2", str(SCRIPT), "--no-set-epoch", "--dropout", "0")
    text = _cause(out)
    assert "epoch never advances" in text and "Dropout" not in text


def test_a_script_without_splitsync_is_told_so() -> None:
    out = _verify("-n", "2", str(PLAIN_DDP))
    text = " ".join(out.stdout.split())
    assert out.returncode == 1, out.stdout + out.stderr
    assert "never calls splitsync.init()" in text and "run.step(optimizer)" in text
    assert "failed before its first step" not in text


# --- correct patterns that must pass ------------------------------------------------------
def test_checkpointing_script_passes_and_leaves_the_users_directory_alone(
        tmp_path: Path) -> None:
    user = tmp_path / "project"
    (user / "ckpt").mkdir(parents=True)
    (user / "notes.txt").write_text("mine")
    before = _tree(user)
    out = _verify_in(user, "-n", "2", str(SCRIPT), "--ckpt", "ckpt",
                     "--run-dir", str(user / "runs"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout
    assert _tree(user) == before


def test_a_users_old_checkpoint_is_not_resumed(tmp_path: Path) -> None:
    """A real run's checkpoint in the user's directory is not seen by either side."""
    user = tmp_path / "project"
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1")
    real = subprocess.run([sys.executable, str(SCRIPT), "--ckpt", "ckpt", "--epochs", "1"],
                          env=env, cwd=user, capture_output=True, text=True, timeout=120)
    assert real.returncode == 0, real.stderr
    before = _tree(user)
    assert any(name.startswith("ckpt/step-") for name, _ in before)
    out = _verify_in(user, "-n", "2", str(SCRIPT), "--ckpt", "ckpt")
    assert out.returncode == 0, out.stdout + out.stderr
    assert _tree(user) == before


@pytest.mark.parametrize("flags", [["--accumulate", "2"], ["--peek"], ["--world-batch", "32"]],
                         ids=["accumulate2", "peek", "world-batch"])
def test_correct_pattern_passes(flags: list[str]) -> None:
    out = _verify("-n", "2", str(SCRIPT), *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout and "all checks passed" in out.stdout


def test_accumulate_records_only_the_steps_that_step() -> None:
    out = _verify("-n", "2", "--steps", "2", "--epochs", "2", str(SCRIPT), "--accumulate", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 optimizer steps compared" in out.stdout
