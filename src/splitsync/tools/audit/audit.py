"""``splitsync audit``'s verdict: per loader and epoch, samples trained once, more, never.

Counts are taken over the steps no crash rolled back (see :mod:`history`). An indexable
dataset's epoch covers ``range(len(dataset))``; a stream's covers, per shard, the positions
up to the furthest one trained (a stream's length is not known beforehand). The last epoch of
a run that has not finished it is "in progress": its untrained samples are not a gap.
Evaluation loaders
(``train=False``, or found by the ledger) are listed apart, never counted as training. A
loader declared with ``repeats=k`` may train a sample up to k times in an epoch. A stream
epoch that ended early (``at_end="stop"``) says how many samples it trained and how many
read ones it left, never a bare "exactly once". A rank with no batch is a problem.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from splitsync.tools.audit.history import Entry, Finding, History, read_history
from splitsync.tools.audit.ledger.format import LEDGER_DIR
from splitsync.tools.audit.padding import padding_problem

__all__ = ["EpochCount", "Report", "audit", "describe_sample"]

_SHIFT = 40  # a stream sample id: shard << 40 | position (splitsync.data.stream.sample_id)


@dataclass(frozen=True)
class EpochCount:
    loader: int
    kind: str
    epoch: int
    samples: int  # the epoch's samples the audit knows of
    once: int
    more: int  # trained more than once
    never: int
    padded: int  # repeats DistributedSampler-style padding added (drop_last=False)
    status: str  # "exactly once", "duplicates", "gaps", "in progress", "dropped by drop_last",
    # "wrong padding" (the padding repeated other samples than DistributedSampler's),
    # "up to k times" (repeats=k), "ended early: trained N, M read and not trained" (streams)


@dataclass(frozen=True)
class Report:
    ok: bool
    run_dir: str
    launches: list[dict[str, Any]]
    epochs: list[EpochCount]
    findings: list[Finding]
    first_bad: dict[str, Any] | None
    unreadable: list[dict[str, str]]
    superseded: list[dict[str, int]]
    bytes: int
    samples_recorded: int
    extra: dict[str, Any] = field(default_factory=dict)
    evaluation: list[dict[str, Any]] = field(default_factory=list)  # loaders, not trained

    @property
    def bytes_per_sample(self) -> float:
        return self.bytes / self.samples_recorded if self.samples_recorded else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["bytes_per_sample"] = round(self.bytes_per_sample, 3)
        return out


def describe_sample(kind: str, sample: int) -> str:
    if kind == "stream":
        return f"shard {sample >> _SHIFT} position {sample & ((1 << _SHIFT) - 1)}"
    return f"index {sample}"


def _arrays(entries: list[Entry]) -> tuple[np.ndarray, ...]:
    """ids (padding left out), and each id's step, rank and launch; plus the padded count."""
    ids, steps, ranks, launches = [], [], [], []
    padded = 0
    for e in entries:
        r = e.record
        real = r.ids[: len(r.ids) - r.padded] if r.padded else r.ids
        padded += r.padded
        ids.append(real)
        n = len(real)
        steps.append(np.full(n, r.step, np.int64))
        ranks.append(np.full(n, e.rank, np.int64))
        launches.append(np.full(n, e.launch, np.int64))
    if not ids:
        empty = np.empty(0, np.int64)
        return empty, empty, empty, empty, np.int64(padded)
    return (np.concatenate(ids), np.concatenate(steps), np.concatenate(ranks),
            np.concatenate(launches), np.int64(padded))


def _universe(kind: str, ids: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    if kind == "map":
        return np.arange(int(info["n"]), dtype=np.int64)
    parts = []
    for shard in np.unique(ids >> _SHIFT):
        top = int((ids[(ids >> _SHIFT) == shard] & ((1 << _SHIFT) - 1)).max())
        parts.append((int(shard) << _SHIFT) + np.arange(top + 1, dtype=np.int64))
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _where(entries: list[Entry], sample: int) -> dict[str, int] | None:
    for e in sorted(entries, key=lambda e: (e.record.step, e.launch, e.rank)):
        if sample in e.record.ids:
            return {"step": e.record.step, "rank": e.rank, "launch": e.launch}
    return None


def _count(history: History, loader: int, epoch: int, entries: list[Entry],
           complete: bool) -> tuple[EpochCount, dict[str, Any] | None]:
    info = history.last_pass(loader) or {"kind": "map", "n": 0}
    kind = info["kind"]
    repeats = int(info.get("repeats", 1))
    ids, steps, ranks, launches, padded = _arrays(entries)
    universe = _universe(kind, ids, info)
    uniq, first, counts = np.unique(ids, return_index=True, return_counts=True)
    inside = np.isin(uniq, universe)
    more = int(np.count_nonzero(counts[inside] > repeats))
    once = int(np.count_nonzero((counts[inside] >= 1) & (counts[inside] <= repeats)))
    missing = np.setdiff1d(universe, uniq, assume_unique=True)
    never = len(missing)
    bad: dict[str, Any] | None = None
    if not inside.all():
        out = int(uniq[~inside][0])
        bad = {"problem": f"outside the dataset of {len(universe)} samples", "sample": out}
    elif more:
        order = np.lexsort((launches, steps, ids))
        s_ids = ids[order]
        again = np.flatnonzero(s_ids[1:] == s_ids[:-1]) + 1  # later occurrences
        pick = order[again[np.argmin(steps[order][again])]]
        sample = int(ids[pick])
        earlier = order[np.searchsorted(s_ids, sample)]
        bad = {"problem": f"trained {int(counts[np.searchsorted(uniq, sample)])} times",
               "sample": sample, "step": int(steps[pick]), "rank": int(ranks[pick]),
               "launch": int(launches[pick]),
               "first_trained": {"step": int(steps[earlier]), "rank": int(ranks[earlier]),
                                 "launch": int(launches[earlier])}}
    status = "exactly once"
    if bad is None and padded and kind == "map":
        bad = padding_problem(history, loader, epoch, entries)
        if bad is not None:
            status = "wrong padding"
    ended = next((e for launch in history.launches for e in launch.ended
                  if e["loader"] == loader and e["epoch"] == epoch), None)
    if bad is not None and status != "wrong padding":
        status = "duplicates" if more else "outside the dataset"
    elif not complete:
        status = "in progress"
    elif ended is not None:
        status = (f"ended early: trained {once + more}, {ended['untrained']} read and not "
                  "trained, nor the rest of those ranks' shards (at_end='stop')")
    elif repeats > 1:
        status = f"up to {repeats} times (repeats={repeats})"
    elif never and kind == "map" and info.get("drop_last") and \
            never < int(info["world_size"]) * int(info["batch_size"]):
        status = "dropped by drop_last"
    elif never:
        status = "gaps"
        sample = int(missing[0])
        bad = {"problem": "never trained", "sample": sample}
        gone = _where([e for e in history.superseded
                       if e.record.loader == loader and e.record.epoch == epoch], sample)
        if gone is not None:
            bad.update(gone, problem="trained only in a step a crash rolled back")
    if bad is not None:
        bad.update(loader=loader, epoch=epoch, kind=kind,
                   name=describe_sample(kind, int(bad["sample"])))
    count = EpochCount(loader, kind, epoch, len(universe), once, more, never, int(padded),
                       status)
    return count, bad


def _complete(history: History, loader: int, epoch: int, last: int) -> bool:
    """Epochs before the loader's last one are done; the last only if its pass finished."""
    if epoch < last:
        return True
    if not history.launches or history.launches[-1].close is None:
        return False
    # the newest launch that ran this pass says (a relaunch of a finished run runs none)
    for launch in reversed(history.launches):
        passes = [p for p in (launch.close or {}).get("passes", ())
                  if p["loader"] == loader and p["epoch"] == epoch]
        if passes:
            return any(p["finished"] for p in passes)
    return False


def _evaluation(history: History, trained: set[int]) -> list[dict[str, Any]]:
    """Loaders that evaluate: said (``train=False``), found by the ledger, or whose passes
    no step ever took (with batches on some rank), with their passes per launch."""
    said: set[int] = set()
    for launch in history.launches:
        said |= launch.evaluation
    out = []
    loaders = sorted({k for launch in history.launches for k in launch.passes})
    for loader in loaders:
        passes = [p for launch in history.launches for p in launch.passes.get(loader, ())]
        explicit = any(p.get("train") is False for p in passes)
        never = loader not in trained and any(p.get("batches", 1) for p in passes)
        if explicit or loader in said or (never and not any(p.get("train") for p in passes)):
            out.append({"loader": loader, "passes": len(passes), "kind": passes[-1]["kind"],
                        "how": "train=False" if explicit else
                        "found: its passes were never followed by a run.step"})
    return out


def _empty_ranks(history: History) -> list[Finding]:
    out = []
    for launch in history.launches:
        for e in launch.empty:
            if e["loader"] in launch.evaluation:
                continue
            out.append(Finding(True, (
                f"launch {launch.number}: rank {e['rank']} had no batch of loader "
                f"{e['loader']} ({e['n']} samples over {e['world_size']} ranks at batch size "
                f"{e['batch_size']}{', drop_last' if e.get('drop_last') else ''}): it trained "
                "nothing; use a smaller batch size, fewer processes or drop_last=False"),
                launch.number))
    return out


def audit(run_dir: str | Path) -> Report:
    """Audit the ledger under ``run_dir`` (raises FileNotFoundError when it has none)."""
    root = Path(run_dir) / LEDGER_DIR
    if not root.is_dir() or not any(root.glob("launch-*")):
        raise FileNotFoundError(f"{root}: no sample ledger here; run with "
                                "splitsync.init(ledger=True, run_dir=...) first.")
    history = read_history(root)
    trained = {e.record.loader for e in (*history.live, *history.superseded)}
    evaluation = _evaluation(history, trained)
    skip = {e["loader"] for e in evaluation}
    groups: dict[tuple[int, int], list[Entry]] = {}
    for e in history.live:
        if e.record.loader not in skip:
            groups.setdefault((e.record.loader, e.record.epoch), []).append(e)
    last = {}
    for loader, epoch in groups:
        last[loader] = max(last.get(loader, epoch), epoch)
    epochs: list[EpochCount] = []
    first_bad = None
    for (loader, epoch), entries in sorted(groups.items()):
        count, bad = _count(history, loader, epoch, entries,
                            _complete(history, loader, epoch, last[loader]))
        epochs.append(count)
        if first_bad is None and bad is not None:
            first_bad = bad
    findings = list(history.findings) + _empty_ranks(history)
    for launch in history.launches[:-1]:
        if launch.close is None and launch.steps:
            findings.append(Finding(False, f"launch {launch.number} ended without run.close "
                                    "(killed or crashed)", launch.number))
    ok = (first_bad is None and not any(f.error for f in findings)
          and not history.unreadable)
    return Report(ok=ok, run_dir=str(run_dir),
                  launches=[launch.summary() for launch in history.launches],
                  epochs=epochs, findings=findings, first_bad=first_bad,
                  unreadable=history.unreadable, superseded=_superseded(history.superseded),
                  bytes=history.bytes, samples_recorded=history.samples,
                  evaluation=evaluation)


def _superseded(entries: list[Entry]) -> list[dict[str, int]]:
    """Per launch, the range of steps a later resume rolled back."""
    spans: dict[int, list[int]] = {}
    for e in entries:
        lo_hi = spans.setdefault(e.launch, [e.record.step, e.record.step])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], e.record.step), max(lo_hi[1], e.record.step)
    return [{"launch": k, "first_step": v[0], "last_step": v[1]}
            for k, v in sorted(spans.items())]
