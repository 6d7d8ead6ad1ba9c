"""``splitsync audit`` of a fault-tolerant run: the lineage of the final state, and the
batches it names, counted per epoch.

Replica groups train side by side and a group's death rolls nothing back, so launches are
not read one after another as for restart-based runs. The run's history is the lineage
carried in its state (:mod:`splitsync.ft.cursor`): the committed steps, each with the groups
(and their incarnations) that took part. The audit takes the longest lineage any rank wrote,
checks that it tiles group-batches 0..cursor-1 exactly once with consecutive steps, and for
every group-batch it names finds the batch that group wrote down when it was handed out
(every rank's part). Those samples, counted per epoch, must be every sample once. Batches
handed out for steps that were discarded, or by a group the lineage does not name at that
step, were trained again or never counted: they are reported as redone, not as errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from splitsync.ft.cursor import lineage_problems
from splitsync.tools.audit.audit import EpochCount, Report
from splitsync.tools.audit.history import Finding
from splitsync.tools.audit.ledger.format import ParsedFile, Step, read_file

__all__ = ["audit_ft", "is_ft"]

_Key = tuple[int, int, int, int]  # group, incarnation, step, group-batch


@dataclass
class _Read:
    deliveries: dict[_Key, dict[int, Step]] = field(default_factory=dict)
    worlds: dict[tuple[int, int], int] = field(default_factory=dict)  # (group, inc) -> ranks
    lineages: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    order: dict[str, Any] | None = None
    launches: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    unreadable: list[dict[str, str]] = field(default_factory=list)
    bytes: int = 0
    records: int = 0


def is_ft(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a fault-tolerant run's ledger."""
    return (Path(run_dir) / "ledger" / "ft").is_dir()


def _read_file(f: ParsedFile, group: int, launch: int, out: _Read, summary: dict[str, Any]
               ) -> None:
    inc = int(f.meta.get("incarnation", 0))
    world = int(f.meta.get("world_size", 1))
    out.worlds[(group, inc)] = world
    rank = int(f.meta.get("rank", 0))
    pending: dict[str, Any] | None = None
    for kind, rec in f.records:
        if kind == "F":
            pending = rec
        elif kind == "S" and pending is not None:
            key = (group, inc, int(pending["step"]), int(pending["k"]))
            out.deliveries.setdefault(key, {})[rank] = rec
            out.records += 1
            summary["last_step"] = max(summary["last_step"], int(pending["step"]))
            pending = None
        elif kind == "L":
            out.lineages.append((int(rec["step"]), int(rec["cursor"]), rec))
        elif kind == "P":
            if summary["resumed_from_step"] is None:
                summary["resumed_from_step"] = int(rec.get("step", 0))
            if out.order is None:
                out.order = rec
            elif any(out.order.get(k) != rec.get(k) for k in ("n", "batch_size", "seed",
                                                               "shuffle", "group_size")):
                out.findings.append(Finding(True, (
                    f"group {group} launch {launch} read the data in another order than the "
                    f"first launch did ({rec} against {out.order}): the lineage's group-batches "
                    "do not name the same samples"), launch))
        elif kind == "C" and rank == 0:
            summary["closed"], summary["clean"] = True, bool(rec.get("clean"))


def _read(root: Path) -> _Read:
    out = _Read()
    for gdir in sorted(root.glob("group-*")):
        group = int(gdir.name.split("-")[1])
        for ldir in sorted(gdir.glob("launch-*"), key=lambda p: int(p.name.split("-")[1])):
            launch = int(ldir.name.split("-")[1])
            summary: dict[str, Any] = {"launch": f"g{group}.{launch}", "group": group,
                                       "world_size": 0, "restart_count": 0, "seed": None,
                                       "resumed_from_step": None, "last_step": 0,
                                       "closed": False, "clean": False}
            for path in sorted(ldir.glob("rank-*.ledger")):
                f = read_file(path)
                out.bytes += f.size
                if f.error is not None:
                    out.unreadable.append({"path": str(path), "error": f.error})
                    out.findings.append(Finding(True, f"{path}: unreadable, {f.error}", launch))
                summary.update(world_size=int(f.meta.get("world_size", 0)),
                               restart_count=int(f.meta.get("restart_count", 0)),
                               seed=f.meta.get("seed"))
                _read_file(f, group, launch, out, summary)
            out.launches.append(summary)
    return out


def _count(order: dict[str, Any], epoch: int, ids: list[np.ndarray], padded: int,
           complete: bool) -> tuple[EpochCount, dict[str, Any] | None]:
    n = int(order["n"])
    all_ids = np.concatenate(ids) if ids else np.empty(0, np.int64)
    counts = np.bincount(all_ids, minlength=n)
    once, more = int((counts == 1).sum()), int((counts > 1).sum())
    never = int((counts == 0).sum())
    bad = None
    status = "exactly once"
    if more:
        status = "duplicates"
        sample = int(np.flatnonzero(counts > 1)[0])
        bad = {"problem": f"trained {int(counts[sample])} times", "sample": sample}
    elif not complete:
        status = "in progress"
    elif never and order.get("drop_last"):
        status = "dropped by drop_last"
    elif never:
        status = "gaps"
        bad = {"problem": "never trained", "sample": int(np.flatnonzero(counts == 0)[0])}
    if bad is not None:
        bad.update(loader=0, epoch=epoch, kind="map", name=f"index {bad['sample']}")
    return EpochCount(0, "map", epoch, n, once, more, never, padded, status), bad


def audit_ft(run_dir: str | Path) -> Report:
    """Audit a fault-tolerant run's ledger (see the module doc)."""
    root = Path(run_dir) / "ledger" / "ft"
    data = _read(root)
    findings = data.findings
    if not data.lineages or data.order is None:
        findings.append(Finding(True, "no lineage was written (no group reached run.save or "
                                "run.close): the committed steps cannot be told apart"))
        return Report(False, str(run_dir), data.launches, [], findings, None, data.unreadable,
                      [], data.bytes, 0)
    step, cursor, lineage = max(data.lineages, key=lambda t: (t[0], t[1]))
    runs = lineage["lineage"]
    for problem in lineage_problems(runs, cursor):
        findings.append(Finding(True, f"lineage: {problem}"))
    per_epoch = int(data.order["per_epoch"])
    ids: dict[int, list[np.ndarray]] = {}
    padded: dict[int, int] = {}
    used: set[_Key] = set()
    samples = 0
    for first, last, start, parts, members in runs:
        for t in range(first, last + 1):
            for p in range(parts):
                k = start + (t - first) * parts + p
                g, inc = (members[p] if p < len(members) else (-1, -1))
                key = (int(g), int(inc), t, k)
                got = data.deliveries.get(key, {})
                want = data.worlds.get((int(g), int(inc)), 1)
                if len(got) < want:
                    findings.append(Finding(True, (
                        f"step {t}: group {g} (incarnation {inc}) trained group-batch {k}, but "
                        f"the ledger has {len(got)} of its {want} rank(s)' record of it")))
                used.add(key)
                for rec in got.values():
                    real = rec.ids[: len(rec.ids) - rec.padded] if rec.padded else rec.ids
                    ids.setdefault(rec.epoch, []).append(real)
                    padded[rec.epoch] = padded.get(rec.epoch, 0) + rec.padded
                    samples += len(rec.ids)
    epochs: list[EpochCount] = []
    first_bad = None
    for epoch in sorted(ids):
        count, bad = _count(data.order, epoch, ids[epoch], padded.get(epoch, 0),
                            cursor >= (epoch + 1) * per_epoch)
        epochs.append(count)
        first_bad = first_bad or bad
    redone = len([k for k in data.deliveries if k not in used])
    groups = sorted({la["group"] for la in data.launches})
    notes = [f"fault tolerant: {len(groups)} replica group(s), {len(data.launches)} launch(es); "
             f"lineage of {step} committed step(s) over {cursor} group-batch(es) in "
             f"{len(runs)} run(s) of steps with the same groups",
             f"{redone} batch(es) handed out for steps that were discarded and redone (or by "
             "a group that did not commit them): not counted"]
    ok = first_bad is None and not any(f.error for f in findings) and not data.unreadable
    return Report(ok=ok, run_dir=str(run_dir), launches=data.launches, epochs=epochs,
                  findings=findings, first_bad=first_bad, unreadable=data.unreadable,
                  superseded=[], bytes=data.bytes, samples_recorded=samples,
                  extra={"notes": notes, "lineage": {"step": step, "cursor": cursor,
                                                     "runs": len(runs)}})
