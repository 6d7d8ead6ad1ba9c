"""`splitsync verify` end to end: the self-test, the script check and its modes.

Launches are shared: one verify call checks every correct pattern at once, one call plants
the three mode faults (each mode reports its own), and the fault cases of the 1-vs-N check
call the library in this process (the CLI's printing is covered by the other calls).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from splitsync.tools.verify.script import verify_script

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HERE = Path(__file__).parent
SCRIPT = HERE / "verify_scripts" / "classify.py"
NANOGPT = HERE / "verify_scripts" / "nanogpt.py"
PLAIN_DDP = HERE / "verify_scripts" / "plain_ddp.py"
DIGITS = HERE.parents[1] / "examples" / "digits.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", COLUMNS="400")
    return env


def _verify(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "splitsync", "verify", *args], env=_env(),
                          cwd=cwd, capture_output=True, text=True, timeout=500)


def _row(out: str, name: str) -> str:
    return next(x for x in out.splitlines() if name in x)


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1)
                  for p in root.rglob("*"))


def _tables(stdout: str) -> list[tuple[str, dict[str, tuple[str, str]], str]]:
    """Each printed table as (title, {check: (result, detail)}, likely cause), with rich's
    wrapped cells joined back."""
    tables: list[tuple[str, dict[str, tuple[str, str]], str]] = []
    title: list[str] = []
    rows: dict[str, tuple[str, str]] = {}
    last: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            if cells[0] or last is None:
                last = cells
                rows[cells[0]] = (cells[1], cells[2])
            else:  # a wrapped continuation of the row above
                last = [a + (" " + b if b else "") for a, b in zip(last, cells, strict=True)]
                rows[last[0]] = (last[1].strip(), last[2].strip())
        elif line.startswith("┏"):
            rows, last = {}, None
            tables.append((" ".join(title), rows, ""))
            title = []
        elif line.startswith(("┃", "┡", "└")):
            continue
        elif line.startswith("likely cause:"):  # one line: the console is wide
            t, r, _ = tables[-1]
            tables[-1] = (t, r, line.removeprefix("likely cause:").strip())
        elif line.strip() and not line.startswith(("all checks", "verify FAILED")):
            title.append(line.strip())
    return tables


def _mode(stdout: str, flag: str) -> tuple[dict[str, tuple[str, str]], str]:
    """The rows and the likely cause of the table whose title names ``flag``."""
    return next((rows, cause) for title, rows, cause in _tables(stdout) if flag in title)


def test_selftest_passes_and_fails_loudly_on_a_bad_backend() -> None:
    out = _verify("-n", "2", "--backend", "gloo", "--backend", "nosuchbackend")
    assert out.returncode == 1, out.stdout + out.stderr
    for row in ("collectives on gloo (2 processes)", "train 1 vs 2 processes",
                "checkpoint round trip (2 processes)", "checkpoint round trip (1 process)"):
        assert "PASS" in _row(out.stdout, row), out.stdout
    line = _row(out.stdout, "collectives on nosuchbackend")
    assert "FAIL" in line and "nosuchbackend" in line
    assert "verify FAILED" in out.stdout


def test_correct_patterns_pass_and_leave_the_users_directory_alone(tmp_path: Path) -> None:
    """Checkpoints, run_dir, a peek, a global batch split by the script and accumulation,
    together; a real run's old checkpoint in the user's directory is not resumed."""
    user = tmp_path / "project"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    real = subprocess.run([sys.executable, str(SCRIPT), "--ckpt", "ckpt", "--epochs", "1"],
                          env=_env(), cwd=user, capture_output=True, text=True, timeout=120)
    assert real.returncode == 0, real.stderr
    before = _tree(user)
    assert any(name.startswith("ckpt/step-") for name, _ in before)
    out = _verify("-n", "2", "--steps", "2", "--epochs", "2", str(SCRIPT), "--ckpt", "ckpt",
                  "--run-dir", str(user / "runs"), "--peek", "--world-batch", "32",
                  "--accumulate", "2", cwd=user)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout and "all checks passed" in out.stdout
    assert "4 optimizer steps compared" in out.stdout  # only the steps that step
    assert _tree(user) == before


# --- one faulty script per cause (1 vs 2 processes, in this process) ----------------------
# the suite: a loss, a data and an initialisation fault; the extended trials: the rest
@pytest.mark.parametrize(("flags", "cause", "failed_row"), [
    (["--reduction", "sum"], "The loss is summed over the batch", "per-step loss"),
    (["--plain-loader"], "Unsharded data", "ranks' samples disjoint"),
    pytest.param(["--dropout", "0.5"], "Dropout draws different masks", "per-step loss", marks=pytest.mark.extended),
    pytest.param(["--batchnorm"], "BatchNorm normalises each rank's B/N samples", "per-step loss", marks=pytest.mark.extended),
    pytest.param(["--no-set-epoch"], "The sampler's epoch never advances", "set_epoch advanced", marks=pytest.mark.extended),
    (["--world-seed"], "initial weights depend on the number of processes",
     "initial weights: 1 vs 2 processes"),
    pytest.param(["--lr-by-world"], "The learning rate depends on the number of processes",
                 "per-step learning rate", marks=pytest.mark.extended),
], ids=["sum", "plain-loader", "dropout", "batchnorm", "no-set-epoch", "world-seed",
        "lr-by-world"])
def test_each_fault_is_reported_with_its_own_cause(flags: list[str], cause: str,
                                                   failed_row: str) -> None:
    report = verify_script(str(SCRIPT), flags, 2, timeout=240)
    failed = [r.check for r in report.results if not r.ok]
    assert failed_row in failed, report.results
    assert report.cause is not None and cause in report.cause, report.cause
    if flags == ["--no-set-epoch"]:  # dropout is off: it must not be blamed
        assert "Dropout" not in report.cause
    if flags == ["--reduction", "sum"]:
        row = next(r for r in report.results if r.check == "per-step loss")
        assert "first differs at step 0" in row.detail


def test_an_unshuffled_training_loader_is_named() -> None:
    """It used to read "this script accumulates or batches by itself: give --batch B"."""
    report = verify_script(str(SCRIPT), ["--no-shuffle"], 2, timeout=240)
    row = next(r for r in report.results if r.check == "equal global batch")
    assert not row.checkable and "the training loader is not shuffled" in row.detail, row
    assert "--batch" not in row.detail


def test_a_script_without_splitsync_is_told_so() -> None:
    report = verify_script(str(PLAIN_DDP), [], 2, timeout=240)
    assert not all(r.ok for r in report.results)
    assert report.cause is not None
    assert "never calls splitsync.init()" in report.cause and "run.step(optimizer)" in report.cause
    assert "failed before" not in report.cause
    assert all(r.ok for r in report.results[:2])  # both runs exited 0: not a crash


# --- the modes ----------------------------------------------------------------------------
MODES = ("--strategies", "ddp,fsdp", "--accumulate", "2", "--resume", "--steps", "2",
         "--epochs", "2")  # the resume: 4 steps straight, 2 then a checkpoint, 2 resumed


def test_each_mode_names_its_planted_fault() -> None:
    """One call, three faults, each caught by its own mode: micro-step losses summed
    (--accumulate), an optimizer over parameters FSDP replaced (--strategies), a
    checkpoint without the optimizer (--resume)."""
    out = _verify("-n", "2", *MODES, str(SCRIPT), "--ckpt", "ckpt", "--sum-micro",
                  "--params-before", "--ckpt-no-opt")
    assert out.returncode == 1, out.stdout + out.stderr
    rows, cause = _mode(out.stdout, "--strategies")
    assert rows["strategy fsdp runs"][0] == "FAIL" and rows["strategy ddp runs"][0] == "PASS"
    assert "Under strategy fsdp the optimizer holds parameters that run.model replaced" in cause
    rows, cause = _mode(out.stdout, "--accumulate")
    assert rows["per-step loss"][0] == "FAIL", rows
    assert rows["per-step loss"][1].startswith("first differs at step 0")
    assert "The loss is summed across micro-steps, not averaged" in cause
    rows, cause = _mode(out.stdout, "--resume")
    assert rows["resumed at 2 processes: optimizer state restored"][0] == "FAIL", rows
    assert "The checkpoint does not restore the optimizer state" in cause


@pytest.mark.extended  # one more cause; each mode's planted fault stays
def test_a_scheduler_stepped_on_micro_steps_is_named() -> None:
    """It used to say only "See the first failed check"; stepped once per optimizer step
    (if run.step(opt): ...) the same scheduler passes."""
    out = _verify("-n", "2", "--accumulate", "2", "--steps", "3", str(SCRIPT), "--sched-micro")
    assert out.returncode == 1, out.stdout + out.stderr
    rows, cause = _mode(out.stdout, "--accumulate")
    assert rows["per-step learning rate"][0] == "FAIL", rows
    assert "runs 2x too fast" in cause and "if run.step(opt): sched.step()" in cause, cause
    out = _verify("-n", "2", "--accumulate", "2", "--steps", "3", str(SCRIPT), "--sched")
    assert out.returncode == 0, out.stdout + out.stderr
    rows, _ = _mode(out.stdout, "--accumulate")
    assert rows["per-step learning rate"] == ("PASS", "equal at every step"), rows


@pytest.mark.extended  # every mode again on another script: the nanoGPT one below stays
def test_digits_example_passes_every_mode() -> None:
    out = _verify("-n", "2", *MODES, str(DIGITS), "--ckpt", "ckpt")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout and "not checkable" not in out.stdout
    rows, _ = _mode(out.stdout, "--resume")
    assert rows["resumed at 2 processes: final parameters"][1].startswith("bit-equal"), rows
    assert rows["resumed at 1 process: final parameters"][1].startswith("equal within"), rows
    rows, _ = _mode(out.stdout, "--accumulate")
    assert rows["per-step loss"] == ("PASS", "equal within rtol 0.0001"), rows


@pytest.mark.extended  # every mode on a larger script; each mode's planted fault stays
def test_nanogpt_style_script_passes_at_equal_global_batch_and_every_mode() -> None:
    """Random-offset batches per rank, accumulation 4 // world, clip, AdamW, checkpoints."""
    out = _verify("-n", "2", str(NANOGPT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout
    rows, _ = _mode(out.stdout, "(1 vs 2 processes)")
    assert rows["equal global batch"] == (
        "PASS", "1 process: 4 micro-batch(es), 16 samples per step; 2 processes: 2 "
        "micro-batch(es) each, 16 samples"), rows
    assert rows["per-step loss"][0] == "not checkable"
    assert rows["per-step loss"][1].startswith("the script draws its own batches")
    assert rows["ranks' samples disjoint"][0] == "PASS"
    assert rows["initial weights: 1 vs 2 processes"][0] == "PASS"
    out = _verify("-n", "2", *MODES, str(NANOGPT))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout
    rows, _ = _mode(out.stdout, "--strategies")
    assert rows["strategy fsdp vs strategy ddp: per-step loss"][0] == "PASS", rows
    assert rows["strategy fsdp vs strategy ddp: final parameters"][0] == "PASS", rows
    rows, _ = _mode(out.stdout, "--accumulate")
    assert rows["per-step loss"][0] == "not checkable", rows
    rows, _ = _mode(out.stdout, "--resume")
    assert rows["resumed at 2 processes: final parameters"] == ("PASS", "bit-equal (17 tensors)")
    assert rows["resumed at 1 process: per-step loss"][0] == "not checkable", rows
