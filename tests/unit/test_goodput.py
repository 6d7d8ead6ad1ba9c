"""``splitsync goodput``: a run's wall time cut into parts that add up to it, from the clocks
its processes wrote; steps a restart redid are told apart from the ones that counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitsync import cli
from splitsync.tools.goodput.report import PARTS, goodput


def _write(folder: Path, name: str, events: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(e) + "\n" for e in events))


def _launch(start: float, resume_at: float, resume_step: int, steps: list[tuple[float, int]],
            *, saves: list[tuple[float, float]] = (), close: float | None = None,
            group: int | None = None, counted: bool = True) -> list[dict]:
    events = [{"ev": "start", "t": start, "started": start, "group": group, "ft": group is not None},
              {"ev": "resume", "t": resume_at, "step": resume_step}]
    events.append({"ev": "steps", "rows": [[t, s, int(counted), 0.0, 0.0] for t, s in steps]})
    events += [{"ev": "save", "t": b, "began": a} for a, b in saves]
    if close is not None:
        events.append({"ev": "close", "t": close})
    return events


def test_a_restart_based_run_splits_into_parts_that_add_up(tmp_path: Path) -> None:
    gp = tmp_path / "goodput"
    # launch 1: starts at 0, resumes at 2, steps 1..6 end at 3..8, saves at step 4 (0.5 s),
    # dies after step 6 (last record 8); launch 2 starts at 10, resumes step 4 at 13
    _write(gp, "x-1-1.jsonl", _launch(0, 2, 0, [(3, 1), (4, 2), (5, 3), (6.5, 4), (7.5, 5),
                                                 (8, 6)], saves=[(5.5, 6.0)]))
    _write(gp, "x-2-2.jsonl", _launch(10, 13, 4, [(14, 5), (15, 6), (16, 7)], close=16.5))
    rep = goodput(tmp_path)
    assert rep.wall == pytest.approx(16.5)
    assert sum(rep.parts.values()) == pytest.approx(rep.wall)
    assert abs(rep.residual) < 1e-9
    assert rep.parts["startup"] == pytest.approx(2 + 3)
    assert rep.parts["down"] == pytest.approx(2)  # last record at 8, next start at 10
    assert rep.parts["save"] == pytest.approx(0.5)
    assert rep.parts["rolled_back"] == pytest.approx(1.5)  # steps 5 and 6 of launch 1
    assert rep.parts["productive"] == pytest.approx(4.5 - 0.5 + 3)
    assert rep.steps == {"committed": 7, "discarded": 0, "rolled_back": 2}
    assert rep.restarts == 1 and set(rep.parts) == set(PARTS)


def test_an_incarnation_started_before_the_last_one_ended_counts_each_second_once(
        tmp_path: Path) -> None:
    gp = tmp_path / "goodput"
    # launch 2's process start reads 0.4 s before launch 1's last record (a start time read
    # from /proc in whole seconds, or a process started while the last one was still writing)
    _write(gp, "x-1-1.jsonl", _launch(0, 2, 0, [(3, 1), (4, 2), (5, 3)], saves=[(4.5, 5.2)]))
    _write(gp, "x-2-2.jsonl", _launch(4.8, 6, 2, [(7, 3), (8, 4)], close=8.5))
    rep = goodput(tmp_path)
    assert rep.wall == pytest.approx(8.5)
    assert abs(rep.residual) < 1e-9, rep
    assert rep.parts["startup"] == pytest.approx(2 + (6 - 5.2))
    assert rep.parts["down"] == 0


def test_the_process_start_time_is_on_the_wall_clock_to_a_tick() -> None:
    import subprocess
    import sys
    import time

    code = ("from splitsync.tools.goodput.clock import process_start_time;"
            "print(repr(process_start_time()))")
    for _ in range(3):
        before = time.time()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True).stdout
        # the child started after ``before`` (to the kernel's 10 ms tick), not a whole
        # second off as /proc/stat's btime would put it
        assert before - 0.05 <= float(out) <= time.time(), (before, out)


def test_fault_tolerant_groups_each_fill_the_job_wall(tmp_path: Path) -> None:
    gp = tmp_path / "goodput"
    _write(gp, "0-1-1.jsonl", _launch(0, 1, 0, [(2, 1), (3, 2), (4, 2), (5, 3)], group=0,
                                      close=6))
    events = _launch(0.5, 1.5, 0, [(2, 1)], group=1)
    _write(gp, "1-1-2.jsonl", events)  # died after step 1, back at 3.5
    _write(gp, "1-2-3.jsonl", _launch(3.5, 4.5, 2, [(5, 3)], group=1, close=5.5))
    rep = goodput(tmp_path)
    assert rep.timelines == 2 and rep.fault_tolerant
    assert sum(rep.parts.values()) == pytest.approx(2 * rep.wall)
    for parts in rep.per_timeline.values():
        assert sum(parts.values()) == pytest.approx(rep.wall)
    assert rep.per_timeline["1"]["idle"] == pytest.approx(0.5 + 0.5)  # late start, early end


def test_the_command_prints_the_parts_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    assert cli.main(["goodput", str(tmp_path)]) == 2
    _write(tmp_path / "goodput", "x-1-1.jsonl", _launch(0, 1, 0, [(2, 1), (3, 2)], close=3))
    capsys.readouterr()
    assert cli.main(["goodput", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "goodput 66.7%" in out and "startup" in out
    assert cli.main(["goodput", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"]["committed"] == 2
