"""``splitsync goodput``: where a run's wall time went, across every restart and relaunch.

Reads what :mod:`splitsync.tools.goodput.clock` wrote. Each process incarnation's time is cut
at its step ends: a step's share is the time since the previous step ended (or since
``run.resume`` returned), less what it spent in its quorum, in a live recovery and in a
save. The parts of a timeline (the launches of one job one after the other; under
fault tolerance, each replica group's incarnations) are

- ``productive``: steps that count in the final run;
- ``discarded``: fault-tolerant steps a failed peer spoiled (trained again);
- ``rolled_back``: steps a later launch redid because it resumed from an older checkpoint;
- ``quorum`` and ``recovery``: torchft's quorum before each step and live recoveries;
- ``save``: stalls inside ``run.save``;
- ``startup``: from the process's start to ``run.resume`` (a restart's cost);
- ``down``: from a process's last record to the next incarnation's start (the failure);
- ``idle``: a replica group not yet started, or finished, while the job runs;
- ``other``: after the last step until ``run.close``.

They add up to the job's wall time (per group under fault tolerance); ``goodput`` is the
productive share.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Incarnation", "GoodputReport", "read_incarnations", "goodput", "PARTS", "render"]

PARTS = ("productive", "discarded", "rolled_back", "quorum", "recovery", "save", "startup",
         "down", "idle", "other")


@dataclass
class Incarnation:
    """One process's records (rank 0 of a launch, or of a replica group's incarnation)."""

    group: str
    started: float
    resume_at: float | None = None
    resume_step: int = 0
    rows: list[list[float]] = field(default_factory=list)  # t_end, step, counted, quorum, recover
    saves: list[tuple[float, float]] = field(default_factory=list)
    closed: float | None = None
    last: float = 0.0  # the time of its last record
    restart_count: int = 0
    ft: bool = False


@dataclass(frozen=True)
class GoodputReport:
    run_dir: str
    wall: float  # seconds, from the first process's start to the last record
    timelines: int  # 1, or the replica groups
    parts: dict[str, float]  # seconds summed over timelines
    goodput: float  # productive / (wall * timelines)
    residual: float  # 1 - sum(parts) / (wall * timelines)
    steps: dict[str, int]  # committed, discarded, rolled back
    launches: int
    restarts: int
    fault_tolerant: bool
    per_timeline: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_incarnations(run_dir: str | Path) -> list[Incarnation]:
    """Every incarnation's records, in order of start (lines cut short are skipped)."""
    out = []
    for path in sorted((Path(run_dir) / "goodput").glob("*.jsonl")):
        inc: Incarnation | None = None
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a write cut by a kill
            kind = rec.get("ev")
            if kind == "start":
                group = rec.get("group")
                inc = Incarnation("x" if group is None else str(group), float(rec["started"]),
                                  restart_count=int(rec.get("restart_count", 0)),
                                  ft=bool(rec.get("ft")))
            if inc is None:
                continue
            inc.last = max(inc.last, float(rec.get("t", 0.0)))
            if kind == "resume":
                inc.resume_at, inc.resume_step = float(rec["t"]), int(rec["step"])
            elif kind == "steps":
                inc.rows.extend(rec["rows"])
                inc.last = max(inc.last, max(r[0] for r in rec["rows"]))
            elif kind == "save":
                inc.saves.append((float(rec["began"]), float(rec["t"])))
            elif kind == "close":
                inc.closed = float(rec["t"])
        if inc is not None:
            out.append(inc)
    return sorted(out, key=lambda i: i.started)


def _rolled_back(incs: list[Incarnation]) -> list[set[int]]:
    """Per incarnation, the row indices a later incarnation's resume rolled back."""
    out: list[set[int]] = [set() for _ in incs]
    for j, later in enumerate(incs):
        if later.resume_at is None or later.ft:
            continue  # fault tolerant: a group's death rolls nothing back
        for i in range(j):
            out[i] |= {n for n, r in enumerate(incs[i].rows) if r[1] > later.resume_step}
    return out


def _cut(inc: Incarnation, rolled: set[int], parts: dict[str, float], not_before: float) -> float:
    """Add ``inc``'s time from ``not_before`` on to ``parts``; returns the time it ends.

    ``not_before`` is where the timeline's previous incarnation ended: an incarnation that
    starts before that (its process was started while the last one's records were still
    being written, or the clocks differ by a few ticks) counts each second once.
    """
    started = max(inc.started, not_before)
    begin = max(inc.resume_at if inc.resume_at is not None else inc.started, started)
    parts["startup"] += begin - started
    saves = sorted(inc.saves)
    prev = begin
    for n, (t_end, _step, counted, quorum, recover) in enumerate(inc.rows):
        span = max(0.0, t_end - prev)
        stall = sum(max(0.0, min(b, t_end) - max(a, prev)) for a, b in saves)
        parts["save"] += stall
        parts["quorum"] += min(quorum, span - stall)
        parts["recovery"] += min(recover, max(0.0, span - stall - quorum))
        rest = max(0.0, span - stall - quorum - recover)
        kind = "discarded" if not counted else "rolled_back" if n in rolled else "productive"
        parts[kind] += rest
        prev = max(prev, t_end)
    end = inc.closed if inc.closed is not None else max(inc.last, prev)
    tail_saves = sum(max(0.0, min(b, end) - max(a, prev)) for a, b in saves)
    parts["save"] += tail_saves
    parts["other"] += max(0.0, end - prev - tail_saves)
    return max(end, prev)


def goodput(run_dir: str | Path) -> GoodputReport:
    """The report for ``run_dir`` (FileNotFoundError when it holds no records)."""
    incs = read_incarnations(run_dir)
    if not incs:
        raise FileNotFoundError(f"{Path(run_dir) / 'goodput'}: no goodput records; they are "
                                "written by runs made with splitsync.init(run_dir=...).")
    # The job ends with the last incarnation that trained; one that starts after that (a
    # group restarted once the others had finished, which refuses to train alone) is not
    # part of the job's time.
    trained = [i for i in incs if i.rows]
    if trained:
        last = max(i.closed if i.closed is not None else i.last for i in trained)
        incs = [i for i in incs if i.started < last]
    ft = any(i.ft for i in incs)
    begin = min(i.started for i in incs)
    groups = sorted({i.group for i in incs})
    timelines = {g: [i for i in incs if i.group == g] for g in groups}
    ends = {}
    per: dict[str, dict[str, float]] = {}
    for g, line in timelines.items():
        parts = dict.fromkeys(PARTS, 0.0)
        rolled = _rolled_back(line)
        prev_end = begin
        for n, inc in enumerate(line):
            gap = max(0.0, inc.started - prev_end)
            parts["idle" if n == 0 else "down"] += gap
            prev_end = max(prev_end, _cut(inc, rolled[n], parts, prev_end))
        per[g], ends[g] = parts, prev_end
    end = max(ends.values())
    for g, parts in per.items():
        tail = end - ends[g]  # this group ended before the job did: done, or died for good
        closed = timelines[g][-1].closed is not None and timelines[g][-1].rows
        parts["idle" if closed else "down"] += tail
    wall = end - begin
    totals = {k: sum(p[k] for p in per.values()) for k in PARTS}
    whole = wall * len(per)
    rows = [(r, n in rb) for line in timelines.values()
            for inc, rb in zip(line, _rolled_back(line), strict=True)
            for n, r in enumerate(inc.rows)]
    steps = {"committed": sum(1 for r, rb in rows if r[2] and not rb),
             "discarded": sum(1 for r, _ in rows if not r[2]),
             "rolled_back": sum(1 for r, rb in rows if r[2] and rb)}
    return GoodputReport(
        run_dir=str(run_dir), wall=wall, timelines=len(per), parts=totals,
        goodput=totals["productive"] / whole if whole > 0 else 0.0,
        residual=1 - sum(totals.values()) / whole if whole > 0 else 0.0, steps=steps,
        launches=len(incs), restarts=len(incs) - len(per), fault_tolerant=ft,
        per_timeline=per)


def render(report: GoodputReport, print_line: Any = print) -> None:
    """The report as a few plain lines (the audit prints them under its own)."""
    whole = report.wall * report.timelines
    who = (f"{report.timelines} replica group(s) x {report.wall:.1f}s" if report.fault_tolerant
           else f"{report.wall:.1f}s")
    print_line(f"goodput {100 * report.goodput:.1f}% of {who} wall time; "
               f"{report.launches} launch(es), {report.restarts} restart(s); steps: "
               + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in report.steps.items()))
    for part in PARTS:
        sec = report.parts[part]
        if sec > 0 or part == "productive":
            share = 100 * sec / whole if whole > 0 else 0.0
            print_line(f"  {part.replace('_', ' '):<12} {sec:9.2f}s  {share:5.1f}%")
    print_line(f"  (the parts add up to the wall time within {100 * abs(report.residual):.2f}%)")
