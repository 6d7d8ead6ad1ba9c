"""Preemption under real launches: a signal to ``splitsync run`` or to one of its workers, at a
moment the script announces (inside an evaluation, inside a save, before the first step);
the launcher exits with 75, the newest checkpoint is the last step taken, and the relaunch
ends bit-equal to a run never stopped. Also: ``--max-restarts`` does not restart a stop, the
ledger shows every sample trained once across it, and a run with no step boundary in its
grace period exits with its previous checkpoint. (benchmarks/preempt_trials.py runs 100+
random trials of the same kind.)
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from launchkit import run_ranks
from safetensors.torch import load_file

from splitsync import PREEMPTED_EXIT_CODE, cli
from splitsync.testing import clean_env

SCRIPT = Path(__file__).with_name("preempt_script.py")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
_CLEAN: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}


@dataclass
class Stopped:
    rc: int
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    @property
    def last_step(self) -> int:
        steps = [int(m.group(1)) for ln in self.lines
                 if (m := re.fullmatch(r"step (\d+)", ln.strip()))]
        return steps[-1] if steps else 0


def launch(args: list[str], *, nproc: int = 2, on: str | None = None, target: str = "",
           delay: float = 0.0, restarts: int = 0, timeout: float = 240,
           torchrun: bool = False, script: Path = SCRIPT) -> Stopped:
    """Run the script (``splitsync run -n nproc``, plain ``torchrun`` with ``torchrun``, or
    ``python`` for ``nproc=0``); on the line ``on`` send ``target`` ("agent:SIGTERM",
    "w1:SIGUSR1", "group:SIGTERM", ...) its signal. ``script``: another script that prints
    the same lines (``pid <rank> <pid>`` to aim at a worker, ``step <n>``)."""
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(script)]
    elif nproc:
        extra = ["--max-restarts", str(restarts)] if restarts else []
        cmd = [sys.executable, "-m", "splitsync", "run", "-n", str(nproc), *extra, str(script)]
    else:
        cmd = [sys.executable, str(script)]
    proc = subprocess.Popen([*cmd, *args], env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    result, pids, fired = Stopped(rc=-1), {}, threading.Event()

    def fire() -> None:
        who, name = target.split(":")
        if who == "group":  # kill -TERM -PGID: DataLoader workers included
            os.killpg(proc.pid, getattr(signal, name))
            return
        os.kill(proc.pid if who == "agent" else pids[int(who[1:])], getattr(signal, name))

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            result.lines.append(line)
            if m := re.match(r"pid (\d+) (\d+)", line):
                pids[int(m.group(1))] = int(m.group(2))
            if on is not None and not fired.is_set() and line.strip() == on:
                fired.set()
                time.sleep(delay)
                fire()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        result.rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=5)
        pytest.fail(f"hung: no exit within {timeout}s of starting\n{result.text}")
    reader.join(timeout=5)
    if on is not None:
        assert fired.is_set(), f"the run never printed {on!r}:\n{result.text}"
    return result


def newest(ck: Path) -> int:
    return int((ck / "latest").read_text().strip().split("-")[1])


def uninterrupted(base: Path, options: tuple[str, ...]) -> dict[str, torch.Tensor]:
    if options not in _CLEAN:
        d = base / ("clean" + "".join(options).replace("-", "_"))
        run_ranks(SCRIPT, 2, str(d / "ck"), str(d / "out.safetensors"), *options, timeout=300)
        _CLEAN[options] = load_file(d / "out.safetensors")
    return _CLEAN[options]


def assert_same(out: Path, clean: dict[str, torch.Tensor], why: str) -> None:
    got = load_file(out)
    assert got.keys() == clean.keys()
    assert all(torch.equal(got[k], clean[k]) for k in got), why


@pytest.mark.parametrize(("options", "on", "target"), [
    # SIGTERM to splitsync run itself (as from scancel or Kubernetes) inside an evaluation
    (("--epochs", "2"), "eval", "agent:SIGTERM"),
    # SIGUSR1 to one worker inside a background save, FSDP, 2 micro-batches a step; paced,
    # with steps to spare after the signal: on a loaded machine the ranks' store readers may
    # take a few hundred ms to see the request, and a run that ends first exits 0 unstopped
    pytest.param(("--epochs", "3", "--strategy", "fsdp", "--accumulate", "2", "--background",
                  "--save-every", "2", "--step-seconds", "0.2"), "save 4", "w1:SIGUSR1",
                 marks=pytest.mark.extended),
])
def test_a_stop_saves_the_last_step_taken_and_the_relaunch_is_exact(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, options: tuple[str, ...],
        on: str, target: str) -> None:
    clean = uninterrupted(tmp_path_factory.getbasetemp(), options)
    ck, out = tmp_path / "ck", tmp_path / "out.safetensors"
    args = [str(ck), str(out), *options]
    stopped = launch(args, on=on, target=target, restarts=2)
    assert stopped.rc == PREEMPTED_EXIT_CODE, stopped.text
    assert newest(ck) == stopped.last_step, stopped.text
    assert "splitsync run: preempted by" in stopped.text, stopped.text
    assert f"stopped after step {stopped.last_step} and saved it" in stopped.text
    assert stopped.text.count("resumed 0") == 1, "a stop is not restarted as a failure"
    finished = launch(args)
    assert finished.rc == 0, finished.text
    assert_same(out, clean, f"stopped after step {stopped.last_step}")


@pytest.mark.parametrize(("nproc", "workers", "target", "extra"), [
    # torchrun's SIGTERM to the group (the test below) stays in the suite
    pytest.param(2, 1, "agent:SIGTERM", (), marks=pytest.mark.extended),
    pytest.param(2, 2, "group:SIGTERM", ("--persistent",), marks=pytest.mark.extended),
    pytest.param(1, 2, "agent:SIGTERM", (), marks=pytest.mark.extended),
    pytest.param(1, 1, "group:SIGTERM", ("--persistent",), marks=pytest.mark.extended),
    pytest.param(0, 2, "group:SIGTERM", (), marks=pytest.mark.extended),
])
def test_loader_workers_survive_a_sigterm_to_the_group_and_the_stop_saves(
        tmp_path: Path, nproc: int, workers: int, target: str, extra: tuple[str, ...]) -> None:
    # the agent passes SIGTERM to its workers' process groups, DataLoader workers included;
    # torch's worker handler dies of a signal its parent did not send, and the main process
    # then raised "DataLoader worker (pid N) is killed by signal" instead of stopping
    ck = tmp_path / "ck"
    args = [str(ck), str(tmp_path / "out.safetensors"), "--epochs", "3", "--workers",
            str(workers), "--eval-every", "0", "--step-seconds", "0.1", *extra]
    stopped = launch(args, nproc=nproc, on="step 3", target=target)
    assert stopped.rc == PREEMPTED_EXIT_CODE, stopped.text
    assert "is killed by signal" not in stopped.text, stopped.text
    assert newest(ck) == stopped.last_step >= 3, stopped.text
    assert f"stopped after step {stopped.last_step}" in stopped.text, stopped.text
    finished = launch(args, nproc=nproc)
    assert finished.rc == 0, finished.text


@pytest.mark.parametrize("nproc", [2, pytest.param(1, marks=pytest.mark.extended)])
def test_loader_workers_survive_torchruns_sigterm_and_the_stop_saves(
        tmp_path: Path, nproc: int) -> None:
    # plain torchrun: its agent SIGTERMs each worker's process group; the workers stop,
    # save and exit 75, which torchrun reports as a failure of its own
    ck = tmp_path / "ck"
    args = [str(ck), str(tmp_path / "out.safetensors"), "--epochs", "3", "--workers", "2",
            "--eval-every", "0", "--step-seconds", "0.1"]
    stopped = launch(args, nproc=nproc, on="step 3", target="agent:SIGTERM", torchrun=True)
    assert stopped.rc != 0, stopped.text
    assert "is killed by signal" not in stopped.text, stopped.text
    assert f"stopped after step {stopped.last_step}" in stopped.text, stopped.text
    assert newest(ck) == stopped.last_step >= 3, stopped.text


@pytest.mark.extended  # a stop's ledger; the stops above stay
def test_the_ledger_shows_every_sample_once_across_a_stop_before_the_first_step(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [str(tmp_path / "ck"), str(tmp_path / "out.safetensors"), "--epochs", "2",
            "--run-dir", str(run_dir)]
    stopped = launch(args, on="resumed 0", target="w0:SIGTERM")  # the loader's start
    assert stopped.rc == PREEMPTED_EXIT_CODE, stopped.text
    assert newest(tmp_path / "ck") == stopped.last_step >= 1
    assert launch(args).rc == 0
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = cli.main(["audit", str(run_dir), "--json"])
    report = json.loads(buf.getvalue())
    assert rc == 0, buf.getvalue()
    assert len(report["launches"]) == 2


def test_no_boundary_within_the_grace_period_exits_with_the_previous_checkpoint(
        tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    args = [str(ck), str(tmp_path / "out.safetensors"), "--grace", "3", "--eval-seconds",
            "60", "--eval-every", "4", "--save-every", "3"]
    stopped = launch(args, nproc=0, on="eval", target="w0:SIGTERM", timeout=120)
    assert stopped.rc == PREEMPTED_EXIT_CODE, stopped.text
    assert "no step boundary came within 3s of SIGTERM" in stopped.text, stopped.text
    assert "previous checkpoint intact, step 3" in stopped.text
    # the evaluation (60 s) came after step 4: the run did not wait for it to end
    assert stopped.last_step == 4 and newest(ck) == 3


def test_a_crash_is_reported_as_one_though_the_agent_sigterms_the_others(tmp_path: Path) -> None:
    # rank 1 crashes inside an evaluation; the agent SIGTERMs rank 0, which cannot agree on
    # a stop step with a dead rank and gives up at its grace period: still a failure
    args = [str(tmp_path / "ck"), str(tmp_path / "out.safetensors"), "--crash-in-eval",
            "--eval-seconds", "60", "--grace", "3"]
    failed = launch(args)
    assert failed.rc == 1, failed.text
    assert "rank 1 crashes in the evaluation" in failed.text
    assert "splitsync run: rank 1 (local rank 1" in failed.text, failed.text
    assert "preempted" not in failed.text


@pytest.mark.extended  # the crash test above stays
def test_a_restart_after_a_crash_is_not_taken_for_a_preemption(tmp_path: Path) -> None:
    # rank 1 is killed while rank 0 is inside an evaluation (no collective to fail on);
    # the agent then SIGTERMs rank 0 to restart both. That SIGTERM is no preemption: rank 0
    # exits at once instead of waiting out its grace period (20 s) for a stop step a dead
    # rank never posts, and says nothing of a stop
    args = [str(tmp_path / "ck"), str(tmp_path / "out.safetensors"), "--epochs", "1",
            "--eval-every", "4", "--eval-seconds", "9"]
    restarted = launch(args, on="eval", target="w1:SIGKILL", restarts=1)
    assert restarted.rc == 0, restarted.text
    assert "came from splitsync run after another worker failed" in restarted.text
    assert "no step boundary came within" not in restarted.text, restarted.text
    assert "reached rank" not in restarted.text, restarted.text
    resumed = [ln for ln in restarted.lines if re.fullmatch(r"resumed \d+", ln.strip())]
    assert len(resumed) == 2, restarted.text  # the first start and the restart
