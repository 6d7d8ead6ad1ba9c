"""``init(ledger=True)`` under real launches and ``splitsync audit`` on what they wrote.

One run with two loaders (an indexable dataset and a 2-worker stream) is SIGKILLed at a random
step, then inside ``run.save``, under ``splitsync run -n 2 --max-restarts 2``; it is relaunched
at 3 processes and then at 1. The audit must find every epoch exactly once, with counts equal
to those from the sample ids the script wrote itself. Then the faults it must catch.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from collections import Counter
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from launchkit import launch

from splitsync import cli
from splitsync.tools.goodput.report import goodput

SCRIPT = Path(__file__).with_name("ledger_script.py")
N = 48


def audit(run_dir: Path) -> tuple[int, dict, str]:
    """(exit status, the JSON report, the rich report) of ``splitsync audit RUN_DIR``."""
    outs = []
    for extra in (["--json"], []):
        buf = io.StringIO()
        with redirect_stdout(buf):
            outs.append((cli.main(["audit", str(run_dir), *extra]), buf.getvalue()))
    (rc, js), (rc_text, text) = outs
    assert rc == rc_text, text
    return rc, json.loads(js), text


def own_counts(run_dir: Path) -> dict[tuple[int, int], Counter]:
    """Per (loader, epoch), how often each sample id was trained, from the script's own files:
    launches in the order they began, each dropping the earlier steps after its resume."""
    launches: dict[str, tuple[float, int, list[list[str]]]] = {}
    for f in (run_dir / "ids").glob("*-r*.txt"):
        head, *rest = f.read_text().splitlines()
        _, resume, _, began = head.split()
        key = f.name.split("-r")[0]
        steps = [ln.split() for ln in rest]
        old = launches.get(key, (float(began), int(resume), []))
        launches[key] = (old[0], old[1], old[2] + steps)
    live: list[list[str]] = []
    for _, resume, steps in sorted(launches.values(), key=lambda t: t[0]):
        live = [s for s in live if int(s[1]) <= resume] + steps
    counts: dict[tuple[int, int], Counter] = {}
    for s in live:
        counts.setdefault((int(s[2]), int(s[3])), Counter()).update(int(i) for i in s[4:])
    return counts


@pytest.mark.extended  # 5 launches; the faults test below stays
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_exactly_once_across_kills_restarts_and_other_world_sizes(tmp_path: Path) -> None:
    rng = random.Random()
    kill = rng.randint(2, 10)  # after a random step of the first attempt (rank 1)
    in_save = rng.choice([s for s in (3, 6, 9, 12) if s > kill])  # then inside run.save
    note = f"kill after step {kill}, then inside run.save at step {in_save}"
    # epoch 0 is 12 steps at 2 processes; stop 2 steps into epoch 1 without saving
    launch(SCRIPT, 2, str(tmp_path), "--kill", str(kill), "--kill-save", str(in_save),
           "--stop", "14", max_restarts=2, timeout=400)
    launch(SCRIPT, 3, str(tmp_path), "--stop", "22", timeout=300)  # 8 steps an epoch at 3
    launch(SCRIPT, 1, str(tmp_path), timeout=300)

    rc, rep, text = audit(tmp_path)
    assert rc == 0, f"{note}\n{text}"
    assert [la["world_size"] for la in rep["launches"]] == [2, 2, 2, 3, 1], text
    assert [la["restart_count"] for la in rep["launches"]][:3] == [0, 1, 2], text
    # the kill in run.save and the stops rolled steps back, and the audit set them aside
    # (steps after a checkpoint are written at the next save or close: a plain kill loses
    # those records with the steps themselves)
    rolled = {s["launch"] for s in rep["superseded"]}
    assert {2, 3, 4} <= rolled, text
    assert "superseded: launch 3 steps 13-14" in text
    ours = own_counts(tmp_path)
    epochs = {(e["loader"], e["epoch"]): e for e in rep["epochs"]}
    assert set(epochs) == {(k, e) for k in (0, 1) for e in range(3)}, text
    for key, e in epochs.items():
        mine = ours[key]
        assert e["status"] == "exactly once", (note, key, text)
        assert (e["samples"], e["once"], e["more"], e["never"]) == (
            N, sum(c == 1 for c in mine.values()), sum(c > 1 for c in mine.values()),
            N - len(mine)) == (N, N, 0, 0), (note, key, text)
    assert "OK: every epoch exactly once" in text
    assert rep["bytes_per_sample"] > 0
    # where the time went, across the same kills and relaunches (splitsync goodput)
    time_spent = goodput(tmp_path)
    assert time_spent.launches == 5 and time_spent.restarts == 4, time_spent
    assert abs(time_spent.residual) < 0.01, time_spent  # the parts add up to the wall time
    assert time_spent.steps["rolled_back"] > 0 and time_spent.parts["rolled_back"] > 0
    assert time_spent.parts["startup"] > 0 and time_spent.parts["productive"] > 0
    assert "goodput" in text and "rolled back" in text


def _first_launch(base: Path) -> None:
    """One process, the indexable loader only: 5 steps, saved at step 3 (epoch 0 of 24)."""
    launch(SCRIPT, 1, str(base), "--map-only", "--stop", "5", timeout=200)


def _relaunch(base: Path, name: str, *args: str) -> Path:
    run_dir = base.parent / name
    shutil.copytree(base, run_dir)
    launch(SCRIPT, 1, str(run_dir), "--map-only", "--stop", "8", *args, timeout=200)
    return run_dir


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_audit_catches_and_names_each_fault(tmp_path: Path) -> None:
    base = tmp_path / "base"
    _first_launch(base)

    rc, rep, text = audit(base)  # the control: one launch, its epoch in progress
    assert rc == 0 and rep["epochs"][0]["status"] == "in progress", text

    seed = _relaunch(base, "seed", "--seed", "7")
    rc, rep, text = audit(seed)
    assert rc == 1, text
    assert "launch 2 resumed loader 0 with seed 7 where launch 1 had 0" in text, text

    grown = _relaunch(base, "grown", "--n", "60")
    rc, rep, text = audit(grown)
    assert rc == 1, text
    assert "dataset length 60 where launch 1 had 48" in text, text

    # model and optimizer restored through run.resume, the data position reset to the
    # epoch's start: the 3 committed steps' samples are trained again
    dropped = _relaunch(base, "dropped", "--drop-position")
    rc, rep, text = audit(dropped)
    assert rc == 1, text
    bad = rep["first_bad"]
    assert bad["problem"] == "trained 2 times" and bad["launch"] == 2 and bad["rank"] == 0
    assert bad["first_trained"]["launch"] == 1 and bad["first_trained"]["step"] <= 3
    assert bad["step"] == 4, bad  # the first step after the resume trains it again
    first_epoch = rep["epochs"][0]
    assert first_epoch["status"] == "duplicates" and first_epoch["more"] == 6, text
    assert f"index {bad['sample']}: trained 2 times at step 4, rank 0, launch 2" in text
    assert rep["superseded"] == [{"launch": 1, "first_step": 4, "last_step": 5}], text
    assert ("launch 2 resumed at step 3 with 6 sample(s) of loader 0's epoch 0 trained, but "
            "the loader began that epoch at position 0: the data position was not restored"
            ) in text, text

    # a truncated ledger file: unreadable, never clean
    cut = tmp_path / "cut"
    shutil.copytree(base, cut)
    victim = next((cut / "ledger" / "launch-00001").glob("rank-*.ledger"))
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) - 7])
    rc, rep, text = audit(cut)
    assert rc == 1, text
    assert rep["unreadable"] and rep["unreadable"][0]["path"] == str(victim), text
    assert "truncated at byte" in rep["unreadable"][0]["error"], text
    assert "unreadable" in text and "OK" not in text


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("relauncher", [pytest.param("python", marks=pytest.mark.extended),
                                        "splitsync run"])
def test_a_finished_run_relaunched_stays_finished(tmp_path: Path, relauncher: str) -> None:
    # the relaunch resumes after the last epoch and runs no pass: the epochs the first
    # launch finished stay finished (the audit read only the newest launch's passes, and
    # showed the last epoch "in progress"); goodput counts the relaunch the same way under
    # either launcher
    args = (str(tmp_path), "--map-only")
    launch(SCRIPT, 1, *args, timeout=200)
    finished, _, _ = audit(tmp_path)
    assert finished == 0
    launch(SCRIPT, 1, *args, timeout=200, max_restarts=1 if relauncher != "python" else 0)
    rc, rep, text = audit(tmp_path)
    assert rc == 0, text
    assert len(rep["launches"]) == 2, text
    assert [e["status"] for e in rep["epochs"]] == ["exactly once"] * len(rep["epochs"]), text
    assert "in progress" not in text, text
    spent = goodput(tmp_path)
    assert (spent.launches, spent.restarts) == (1, 0), spent  # the no-op relaunch: no time
