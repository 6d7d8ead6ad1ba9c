"""Preemption under a real one-node SLURM: ``scancel`` of a running ``srun -n 2`` job leaves a
checkpoint at the last step taken (also with a loader's workers, which the signal reaches
too) and a new ``srun`` finishes bit-equal to a run never stopped; an ``sbatch --requeue --signal=USR1@N`` job stops on SIGUSR1, requeues itself
(``scontrol requeue``) and finishes, bit-equal too.
"""

from __future__ import annotations

import re
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
import torch
from jobkit import job_env, python
from safetensors.torch import load_file
from slurmkit import Slurm

SCRIPT = Path(__file__).parents[1] / "launcher" / "preempt_script.py"
OPTIONS = ("--epochs", "3", "--save-every", "4")
_CLEAN: dict[str, dict[str, torch.Tensor]] = {}


def _env() -> dict[str, str]:
    return job_env(OMP_NUM_THREADS="1")


def _srun(slurm: Slurm, folder: Path, *extra: str, until: str | None = None,
          timeout: float = 200) -> tuple[int, list[str]]:
    """``srun -n 2`` of the preemption script; with ``until``, ``scancel`` the job as soon
    as that line appears. Returns srun's exit code and the lines the job printed."""
    name = f"splitsync-preempt-{uuid.uuid4().hex[:8]}"
    cmd = ["srun", f"--job-name={name}", "-n", "2", "--cpu-bind=none",
           *python(str(SCRIPT), str(folder / "ck"), str(folder / "out.safetensors"),
                   *OPTIONS, *extra)]
    proc = subprocess.Popen(cmd, env=slurm.env(_env()),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        cancelled = False
        for line in proc.stdout:
            lines.append(line)
            if until is not None and not cancelled and line.strip() == until:
                cancelled = True  # as a user or a preempting scheduler would
                slurm.client("scancel", f"--name={name}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        slurm.client("scancel", f"--name={name}")
        proc.kill()
        pytest.fail(f"srun did not end within {timeout}s:\n{''.join(lines)}")
    reader.join(timeout=10)
    return rc, lines


def _steps(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for ln in lines if (m := re.fullmatch(r"step (\d+)", ln.strip()))]


def _newest(ck: Path) -> int:
    return int((ck / "latest").read_text().strip().split("-")[1])


def _clean(slurm: Slurm, base: Path) -> dict[str, torch.Tensor]:
    if "srun" not in _CLEAN:
        rc, lines = _srun(slurm, base)
        assert rc == 0, "".join(lines)
        _CLEAN["srun"] = load_file(base / "out.safetensors")
    return _CLEAN["srun"]


def _same(out: Path, clean: dict[str, torch.Tensor]) -> bool:
    got = load_file(out)
    return got.keys() == clean.keys() and all(torch.equal(got[k], clean[k]) for k in got)


@pytest.mark.timeout(600)
def test_scancel_of_srun_leaves_the_last_step_and_a_new_srun_ends_bit_equal(
        slurm: Slurm, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    clean = _clean(slurm, tmp_path_factory.mktemp("clean-srun"))
    # SIGTERM to every task, SIGKILL Slurm.kill_wait (30 s, SLURM's default) later: a
    # loaded machine's teardown after the stop's save may take more than 10 s
    rc, lines = _srun(slurm, tmp_path, "--step-seconds", "0.3", until="step 5")
    text = "".join(lines)
    assert rc != 0, text  # the job was cancelled
    assert "stopped after step" in text, text
    taken = _steps(lines)[-1]
    assert _newest(tmp_path / "ck") == taken >= 5, text
    rc, lines = _srun(slurm, tmp_path)
    assert rc == 0, "".join(lines)
    assert f"resumed {taken}" in "".join(lines)
    assert _same(tmp_path / "out.safetensors", clean)


@pytest.mark.extended  # SLURM's signal comes 70 s into the job, by design
@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", [("--workers", "1"),
                                     ("--workers", "2", "--persistent")])
def test_scancel_with_loader_workers_stops_at_the_last_step_and_saves(
        slurm: Slurm, tmp_path: Path, workers: tuple[str, ...]) -> None:
    # scancel signals every process of the job step, DataLoader workers included: they
    # must outlive it, or the main process raises "DataLoader worker ... is killed by
    # signal" before its stop
    rc, lines = _srun(slurm, tmp_path, "--step-seconds", "0.3", "--eval-every", "0",
                      *workers, until="step 5")
    text = "".join(lines)
    assert rc != 0, text  # the job was cancelled
    assert "is killed by signal" not in text, text
    assert "stopped after step" in text, text
    taken = _steps(lines)[-1]
    assert _newest(tmp_path / "ck") == taken >= 5, text


@pytest.mark.extended  # SLURM holds a requeued job ~100 s: scancel's stop above stays
@pytest.mark.timeout(600)
def test_a_requeueable_batch_job_requeues_itself_on_usr1_and_finishes(
        slurm: Slurm, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    clean = _clean(slurm, tmp_path_factory.mktemp("clean-srun"))
    # SIGUSR1 70 s after the start, while the first run (6 s a step) still trains. SLURM
    # looks at time limits every 30 s and sends it up to that much early; a signal before
    # run.resume ends the process, so not before 40 s. The requeued run goes fast, and gets
    # more time (as root) so that its own warning does not come: a signal after run.close
    # has its usual effect, and SIGUSR1 would end it.
    args = " ".join(python(str(SCRIPT), str(tmp_path / "ck"), str(tmp_path / "out.safetensors"),
                           *OPTIONS))
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH --requeue
#SBATCH --signal=USR1@110
#SBATCH --time=3
#SBATCH -n 2
#SBATCH --output={tmp_path}/job-%j.out
#SBATCH --open-mode=append
echo "run ${{SLURM_RESTART_COUNT:-0}}"
if [ -z "$SLURM_RESTART_COUNT" ]; then PACE=6
else PACE=0; scontrol update JobId=$SLURM_JOB_ID TimeLimit=10; fi
srun --cpu-bind=none {args} --step-seconds $PACE
""")
    submitted = slurm.client("sbatch", "--parsable", str(script), base=_env())
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip()
    job = slurm.wait_job(job_id, timeout=500)
    out = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert int(job["Restarts"]) >= 1, out
    assert "stopped after step" in out and "SIGUSR1" in out, out
    assert f"SLURM job {job_id} requeued" in out, out
    assert _same(tmp_path / "out.safetensors", clean), out
