"""srun and sbatch on a real one-node SLURM: what splitsync reads, and training under srun
that ends bit-equal to ``splitsync run``."""

from __future__ import annotations

import json
import shlex
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jobkit import SCRIPT, job_env, python, run_job
from slurmkit import NODE, Slurm

pytestmark = pytest.mark.timeout(240)
PROBE = Path(__file__).parent / "scripts" / "probe_env.py"


def _srun(slurm: Slurm, out: Path, *options: str) -> tuple[list[str], Callable[[], None]]:
    """``srun OPTIONS python train_tiny.py OUT``, and how to cancel it on a timeout (srun's
    tasks are slurmstepd's children, not srun's)."""
    name = f"splitsync-test-{uuid.uuid4().hex[:8]}"
    command = ["srun", f"--job-name={name}", *options,
               *python(str(SCRIPT), str(out))]
    return command, lambda: slurm.client("scancel", f"--name={name}")


def _same_step(ranks: list[dict[str, Any]]) -> dict[str, str]:
    first = ranks[0]["slurm"]
    assert {r["slurm"]["SLURM_JOB_ID"] for r in ranks} == {first["SLURM_JOB_ID"]}
    return first


def test_srun_two_tasks_train_like_splitsync_run(slurm: Slurm, reference: dict[str, Any],
                                                 tmp_path: Path) -> None:
    # No binding (as without task/affinity): torch alone would start one thread per CPU
    # in each task, the case the demo ran 6 times slower in.
    command, cancel = _srun(slurm, tmp_path, "-n", "2", "--cpu-bind=none")
    result = run_job(command, tmp_path, slurm.env(job_env()), timeout=150, on_timeout=cancel)
    assert result["weights"] == reference["weights"]
    ranks = result["ranks"]
    step = _same_step(ranks)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert (r["launcher"], r["world_size"], r["local_world_size"], r["node_rank"]) == (
            "slurm", 2, 2, 0)
        assert r["local_rank"] == int(r["slurm"]["SLURM_LOCALID"]) == r["rank"]
        assert r["master_addr"] == NODE
        assert r["job_id"] == f"slurm-{step['SLURM_JOB_ID']}.{step['SLURM_STEP_ID']}"
        # the layout as SLURM writes it; the ..._INT variant it never sets
        assert r["slurm"]["SLURM_STEP_TASKS_PER_NODE"] == "2"
        assert "SLURM_STEP_TASKS_PER_NODE_INT" not in r["slurm"]
        # srun set no OMP_NUM_THREADS: init shared the node's CPUs between the tasks
        assert r["affinity"] == slurm.cpus
        threads = max(1, slurm.cpus // 2)
        assert (r["omp_num_threads"], r["torch_threads"]) == (str(threads), threads)


def test_srun_three_tasks_on_one_node_read_slurms_layout(slurm: Slurm, tmp_path: Path) -> None:
    # What splitsync reads, without training (no torch): SLURM's default binding
    # (task/affinity). With fewer CPUs than tasks, --overcommit lets them share a CPU.
    few = ("--overcommit",) if slurm.cpus < 3 else ()
    done = slurm.client("srun", "-N", "1", "-n", "3", *few,
                        *python(str(PROBE), str(tmp_path), "task"), timeout=120,
                        base=job_env())
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = sorted((json.loads(p.read_text()) for p in tmp_path.glob("task-*.json")),
                   key=lambda r: r["rank"])
    _same_step(ranks)
    assert [r["rank"] for r in ranks] == [0, 1, 2]
    assert sorted(r["local_rank"] for r in ranks) == [0, 1, 2]
    for r in ranks:
        assert r["slurm"]["SLURM_STEP_TASKS_PER_NODE"] == "3"
        assert "SLURM_NTASKS_PER_NODE" not in r["slurm"]  # only with --ntasks-per-node
        assert r["slurm"]["SLURM_PROCID"] == str(r["rank"])
        assert r["slurm"]["SLURM_LOCALID"] == str(r["local_rank"])
        assert (r["launcher"], r["world_size"], r["local_world_size"], r["node_rank"]) == (
            "slurm", 3, 3, 0)
        assert r["job_id"] == f"slurm-{r['slurm']['SLURM_JOB_ID']}.0"


def test_batch_script_is_one_process_and_its_srun_steps_read_their_own_layout(
        slurm: Slurm, tmp_path: Path) -> None:
    # sbatch -n 2 --ntasks-per-node=2: the batch script itself carries SLURM_PROCID=0 and
    # SLURM_NTASKS=2; a smaller srun step inside keeps the job's SLURM_NTASKS_PER_NODE=2.
    probe = shlex.join(python(str(PROBE), str(tmp_path)))
    wrap = f"{probe} batch && srun -n 1 {probe} step"
    submitted = slurm.client("sbatch", "--parsable", "-n", "2", "--ntasks-per-node=2",
                             f"--output={tmp_path}/batch.out", f"--wrap={wrap}",
                             base=job_env())
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = slurm.wait_job(submitted.stdout.strip(), timeout=120)
    out = (tmp_path / "batch.out").read_text() if (tmp_path / "batch.out").exists() else ""
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), out
    (batch,) = [json.loads(p.read_text()) for p in tmp_path.glob("batch-*.json")]
    (step,) = [json.loads(p.read_text()) for p in tmp_path.glob("step-*.json")]
    assert (batch["slurm"]["SLURM_PROCID"], batch["slurm"]["SLURM_NTASKS"]) == ("0", "2")
    assert "SLURM_STEP_ID" not in batch["slurm"]
    assert (batch["launcher"], batch["world_size"]) == ("none", 1)
    assert "not 2" in batch["note"] and "srun" in batch["note"]
    assert step["slurm"]["SLURM_NTASKS_PER_NODE"] == "2"
    assert (step["launcher"], step["world_size"], step["local_world_size"]) == ("slurm", 1, 1)
    assert step["job_id"] == f"slurm-{step['slurm']['SLURM_JOB_ID']}.0"
