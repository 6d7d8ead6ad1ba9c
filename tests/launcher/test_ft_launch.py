"""``splitsync run --replica-groups R -n N`` with ``init(fault_tolerance="torchft", ledger=True)``:
a replica group SIGKILLed in the middle of a step (its peers' all-reduce fails) is restarted
by its own torchrun agent and recovers live from the survivors, who never stop.

Checked, without timing: the survivors keep their pids; they discard exactly the step the
kill spoiled; the recovered group's weights equal the survivors' at its first committed step
and at the end; ``splitsync audit`` finds every sample trained once.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from ftkit import SCRIPT, summary
from launch_helpers import splitsync

from splitsync.tools.goodput.report import goodput

pytest.importorskip("torchft")


def _run(tmp_path: Path, nproc: int, samples: int, kill: int, strategy: str = "ddp") -> dict:
    out = tmp_path / "run"
    out.mkdir()
    proc = splitsync("run", "--replica-groups", "2", "-n", str(nproc), "--max-restarts", "3",
                     str(SCRIPT), str(out), "--kill-at", str(kill), "--kill-mid",
                     "--samples", str(samples), "--slow", "0.3", "--strategy", strategy,
                     timeout=540,
                     OMP_NUM_THREADS="1")
    note = f"{strategy}: kill mid-step after step {kill}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, note
    s = summary(out)
    starts = [json.loads(line) for f in out.glob("steps-g*-r*.jsonl")
              for line in f.read_text().splitlines() if '"start"' in line]
    assert starts and all(r["count_refused"] and not r["preempt_armed"] for r in starts), starts
    assert s["pids"][(0, 0)] == [s["done"][(0, 0)]["pid"]], note  # one survivor, never restarted
    # the kill spoiled one step of the survivors: discarded, then trained again
    assert s["survivor_attempted"] - s["survivor_committed"] == 1, note
    assert s["rejoins"], f"group 1 never came back before the end: {note}"
    assert all(p == 2 for _, _, _, p in s["rejoins"]), s["rejoins"]
    assert s["mismatched_steps"] == [], note  # the recovered group's weights equal the survivors'
    finals = {d["hash"] for d in s["done"].values() if d is not None}
    assert len(finals) == 1 and s["done"][(1, 0)] is not None, s["done"]
    audit = splitsync("audit", str(out), "--json", timeout=120)
    report = json.loads(audit.stdout)
    assert audit.returncode == 0, audit.stdout
    assert [e["status"] for e in report["epochs"]] == ["exactly once"], report["epochs"]
    assert report["epochs"][0]["once"] == samples
    time_spent = goodput(out)  # where the time went: the parts add up to the wall time
    assert time_spent.fault_tolerant and time_spent.timelines == 2
    assert abs(time_spent.residual) < 0.01 and time_spent.steps["discarded"] >= 1
    assert time_spent.parts["quorum"] > 0 and time_spent.restarts >= 1
    return s


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_groups_of_one_train_through_a_kill(tmp_path: Path) -> None:
    _run(tmp_path, 1, samples=1003, kill=random.randint(20, 60))


@pytest.mark.slow
@pytest.mark.extended  # four processes: the suite's kill is the groups of one above
@pytest.mark.timeout(600)
def test_two_groups_of_two_train_through_a_kill(tmp_path: Path) -> None:
    _run(tmp_path, 2, samples=2003, kill=random.randint(20, 60))


@pytest.mark.slow
@pytest.mark.extended  # four processes: the suite's kill is the groups of one above
@pytest.mark.timeout(600)
def test_hsdp_groups_of_two_train_through_a_kill(tmp_path: Path) -> None:
    """FSDP2 sharded inside each group, its gradient shards averaged across groups; a
    recovered group receives its shards from the peer rank that holds the same ones."""
    _run(tmp_path, 2, samples=2003, kill=random.randint(20, 60), strategy="hsdp")


@pytest.mark.slow
@pytest.mark.extended  # two whole jobs of 60 and 40 steps
@pytest.mark.timeout(600)
def test_a_whole_job_restart_resumes_from_the_durable_checkpoint(tmp_path: Path) -> None:
    """Both groups stop after step 60 (checkpoints every 25 steps, written by one group);
    relaunched, the job resumes at step 50 and finishes; the audit spans both jobs."""
    out = tmp_path / "run"
    out.mkdir()
    common = ["run", "--replica-groups", "2", "-n", "1", str(SCRIPT), str(out),
              "--samples", "1003", "--save-every", "25", "--slow", "0"]
    first = splitsync(*common, "--stop-at", "60", timeout=400, OMP_NUM_THREADS="1")
    assert first.returncode == 0, first.stderr[-4000:]
    assert sorted(p.name for p in (out / "ckpt").glob("step-*")) == [
        "step-000025", "step-000050"]
    second = splitsync(*common, timeout=400, OMP_NUM_THREADS="1")
    assert second.returncode == 0, second.stderr[-4000:]
    rows = [json.loads(x) for f in out.glob("steps-g*-r0.jsonl")
            for x in f.read_text().splitlines()]
    ended = max(r["t"] for r in rows if r["ev"] == "stopped")  # the first job's end
    again = [r["step"] for r in rows if r["ev"] == "start" and r["t"] > ended]
    # the second job resumed from step 50, not from 0 (a group that started later than the
    # other recovered from it, further on)
    assert len(again) == 2 and min(again) == 50, again
    s = summary(out)
    finals = {d["hash"] for d in s["done"].values() if d is not None}
    assert len(finals) == 1 and None not in s["done"].values(), s["done"]
    audit = splitsync("audit", str(out), "--json", timeout=120)
    assert audit.returncode == 0, audit.stdout[-4000:]
    report = json.loads(audit.stdout)
    assert [(e["status"], e["once"]) for e in report["epochs"]] == [("exactly once", 1003)]
