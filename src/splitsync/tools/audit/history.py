"""A run's ledgers read back: launches in order, rolled-back steps set aside, changes found.

Every launch (a ``splitsync run``, each elastic restart inside it, a relaunch at another size)
has its own folder of per-rank files. Launch L that resumed from step s supersedes every step
after s recorded by earlier launches: those steps were taken after the last committed
checkpoint and redone. A resume that changes what the order of samples depends on (the seed,
the dataset's length, the batch size, the shuffle) is a finding, never smoothed over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitsync.tools.audit.ledger.format import ParsedFile, Step, read_file

__all__ = ["Entry", "Launch", "History", "Finding", "read_history"]

# what the order of a loader's samples depends on; a resume that changes one is reported
_VOUCHED = ("kind", "seed", "n", "batch_size", "shuffle", "order", "n_shards", "window")
_NAMES = {"n": "dataset length", "batch_size": "batch size", "n_shards": "shard count",
          "window": "shuffle window", "kind": "kind of data"}


@dataclass(frozen=True)
class Finding:
    """Something the audit reports; ``error`` ones make it fail."""

    error: bool
    message: str
    launch: int | None = None


@dataclass(frozen=True)
class Entry:
    """One step record and who wrote it."""

    launch: int
    rank: int
    record: Step


@dataclass
class Launch:
    number: int
    files: dict[int, ParsedFile] = field(default_factory=dict)
    world_size: int = 0
    restart_count: int = 0
    resume: dict[str, Any] | None = None
    passes: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # loader -> P records
    close: dict[str, Any] | None = None  # rank 0's C record
    steps: int = 0  # the highest step recorded
    evaluation: set[int] = field(default_factory=set)  # loaders said or found to evaluate
    empty: list[dict[str, Any]] = field(default_factory=list)  # a rank's pass with no batch
    ended: list[dict[str, int]] = field(default_factory=list)  # stream epochs ended early

    def summary(self) -> dict[str, Any]:
        r = self.resume
        return {"launch": self.number, "world_size": self.world_size,
                "restart_count": self.restart_count,
                "resumed_from_step": None if r is None else (r["step"] if r["resumed"] else 0),
                "last_step": self.steps, "closed": self.close is not None,
                "clean": bool(self.close and self.close.get("clean")),
                "seed": next((f.meta.get("seed") for f in self.files.values()), None)}


@dataclass
class History:
    launches: list[Launch]
    live: list[Entry]
    superseded: list[Entry]
    findings: list[Finding]
    unreadable: list[dict[str, str]]
    bytes: int
    samples: int

    def last_pass(self, loader: int) -> dict[str, Any] | None:
        for launch in reversed(self.launches):
            if launch.passes.get(loader):
                return launch.passes[loader][-1]
        return None


def _read_launch(folder: Path, number: int, unreadable: list[dict[str, str]],
                 findings: list[Finding]) -> tuple[Launch, list[Entry]]:
    launch = Launch(number)
    entries: list[Entry] = []
    passes: dict[int, dict[int, list[dict[str, Any]]]] = {}  # rank -> loader -> P records
    closes: dict[int, dict[str, Any]] = {}
    for path in sorted(folder.glob("rank-*.ledger")):
        f = read_file(path)
        rank = int(f.meta.get("rank", path.stem.split("-")[1]))
        launch.files[rank] = f
        if f.error is not None:
            unreadable.append({"path": str(path), "error": f.error})
            findings.append(Finding(True, f"{path}: unreadable, {f.error}; the audit cannot "
                                    "vouch for the samples this file recorded", number))
        if f.meta:
            launch.world_size = max(launch.world_size, int(f.meta["world_size"]))
            launch.restart_count = int(f.meta.get("restart_count", 0))
        for kind, rec in f.records:
            if kind == "S":
                entries.append(Entry(number, rank, rec))
                launch.steps = max(launch.steps, rec.step)
            elif kind == "R" and launch.resume is None:
                launch.resume = rec
            elif kind == "P":
                passes.setdefault(rank, {}).setdefault(int(rec["loader"]), []).append(rec)
                _pass_notes(launch, rank, rec)
            elif kind == "C":
                closes[rank] = rec
                launch.evaluation |= {int(p["loader"]) for p in rec.get("passes", ())
                                      if p.get("evaluation")}
                _ended(launch, rec.get("ended_early", ()))
    # every rank records the same passes and close: the lowest rank that has them speaks
    launch.passes = passes[min(passes)] if passes else {}
    launch.close = closes[min(closes)] if closes else None
    missing = sorted(set(range(launch.world_size)) - set(launch.files))
    if missing:
        findings.append(Finding(True, f"launch {number}: no ledger file for rank(s) {missing} "
                                f"of {launch.world_size}", number))
    return launch, entries


def _pass_notes(launch: Launch, rank: int, rec: dict[str, Any]) -> None:
    """What one rank's pass record says besides the order: evaluation, no batch, an end."""
    loader = int(rec["loader"])
    if rec.get("train") is False:
        launch.evaluation.add(loader)
    elif rec.get("kind") == "map" and rec.get("batches") == 0 and not any(
            e["rank"] == rank and e["loader"] == loader for e in launch.empty):
        launch.empty.append({"rank": rank, **rec})
    end = rec.get("ended_early") or ()
    if end:
        _ended(launch, [{"loader": loader, "epoch": int(end[0]), "untrained": int(end[1])}])


def _ended(launch: Launch, notes: Any) -> None:
    for note in notes:
        if note not in launch.ended:
            launch.ended.append(dict(note))


def _changes(earlier: list[Launch], launch: Launch, findings: list[Finding]) -> None:
    for loader, passes in launch.passes.items():
        prev = next((p for p in reversed(earlier) if p.passes.get(loader)), None)
        if prev is None:
            continue
        old, new = prev.passes[loader][-1], passes[0]
        for key in _VOUCHED:
            if old.get(key) != new.get(key):
                findings.append(Finding(True, (
                    f"launch {launch.number} resumed loader {loader} with "
                    f"{_NAMES.get(key, key)} {new.get(key)!r} where launch {prev.number} had "
                    f"{old.get(key)!r}: the samples after the resume follow another order, so "
                    "the ledger cannot vouch that they continue the interrupted epoch"),
                    launch.number))


def _position(launch: Launch, live: list[Entry], findings: list[Finding]) -> None:
    """A resumed loader must begin where the committed steps left its epoch."""
    assert launch.resume is not None
    for loader, passes in launch.passes.items():
        first = passes[0]
        if first.get("train") is False or loader in launch.evaluation:
            continue  # evaluation: nothing trained to continue from
        if int(first.get("step", 0)) != int(launch.resume["step"]):
            continue  # its first pass began after steps of this launch: not the resume
        epoch = int(first["epoch"])
        begun = sum(int(x) for x in first.get("offsets", ())) if first["kind"] == "stream" \
            else int(first.get("start", 0))
        trained = sum(len(e.record.ids) - e.record.padded for e in live
                      if e.record.loader == loader and e.record.epoch == epoch)
        if begun != trained:
            how = "not restored" if begun < trained else "ahead of them"
            findings.append(Finding(True, (
                f"launch {launch.number} resumed at step {launch.resume['step']} with "
                f"{trained} sample(s) of loader {loader}'s epoch {epoch} trained, but the "
                f"loader began that epoch at position {begun}: the data position was {how}"),
                launch.number))


def _lost_steps(launch: Launch, live: list[Entry], findings: list[Finding]) -> None:
    """Every rank of a launch takes every step: a step some rank lacks was lost."""
    by_rank: dict[int, set[int]] = {r: set() for r in range(launch.world_size)}
    for e in live:
        if e.launch == launch.number:
            by_rank.setdefault(e.rank, set()).add(e.record.step)
    every = set().union(*by_rank.values()) if by_rank else set()
    for rank, steps in sorted(by_rank.items()):
        gone = sorted(every - steps)
        if gone and rank in launch.files:
            findings.append(Finding(True, (
                f"launch {launch.number}: rank {rank} has no record of {len(gone)} step(s) "
                f"the other ranks took (first: step {gone[0]}); its ledger was cut short or "
                "lost"), launch.number))


def read_history(root: Path) -> History:
    """Read ``root`` (a run's ``ledger`` folder) and set aside the rolled-back steps."""
    findings: list[Finding] = []
    unreadable: list[dict[str, str]] = []
    folders = sorted((p for p in root.glob("launch-*") if p.name[7:].isdigit()),
                     key=lambda p: int(p.name[7:]))
    launches: list[Launch] = []
    live: list[Entry] = []
    superseded: list[Entry] = []
    size = samples = 0
    for folder in folders:
        launch, entries = _read_launch(folder, int(folder.name[7:]), unreadable, findings)
        size += sum(f.size for f in launch.files.values())
        samples += sum(len(e.record.ids) for e in entries)
        r = launch.resume
        if r is not None:
            start = int(r["step"]) if r["resumed"] else 0
            keep = [e for e in live if e.record.step <= start]
            superseded += [e for e in live if e.record.step > start]
            live = keep
            if r["resumed"] and launches:
                _changes(launches, launch, findings)
            _position(launch, live, findings)
        elif entries and live:
            findings.append(Finding(True, (
                f"launch {launch.number} trained without run.resume after earlier launches "
                "had trained: the ledger cannot tell which of their steps it continues or "
                "rolled back; every step is counted"), launch.number))
        live += entries
        launches.append(launch)
    for launch in launches:
        _lost_steps(launch, live, findings)
    return History(launches, live, superseded, findings, unreadable, size, samples)
