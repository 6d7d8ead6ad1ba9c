"""Random augmentation as a cause, from evidence: the draws each step took from the global
generators on each side (recorded by :mod:`splitsync.tools.verify.draws`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["augmentation_cause", "plain_batchnorm"]

_NAMES = {"python": "Python's random", "numpy": "NumPy's np.random", "torch": "torch's generator"}


def plain_batchnorm(modules: Sequence[str]) -> bool:
    """Whether the model has a BatchNorm that normalises each rank's samples alone
    (SyncBatchNorm, and splitsync's CPU one, do not)."""
    return any("BatchNorm" in m and "SyncBatchNorm" not in m for m in modules)


def _per_step(steps: Sequence[Mapping[str, Any]], upto: int) -> list[dict[str, int]]:
    return [dict(st.get("draws") or {}) for st in steps[:upto]]


def _describe(counts: list[int], generator: str) -> str:
    if generator == "torch":
        return f"in {sum(1 for c in counts if c)} of {len(counts)} steps"
    if any(c < 0 for c in counts):
        return "many words a step"
    lo, hi = min(counts), max(counts)
    return f"{lo} words a step" if lo == hi else f"{lo} to {hi} words a step"


def augmentation_cause(a: Sequence[Mapping[str, Any]], b: Sequence[Sequence[Mapping[str, Any]]],
                       upto: int, label_a: str, label_b: str, *, dropout: bool,
                       same_world: bool) -> str | None:
    """The draws from the global generators in the first ``upto`` steps of side ``a``
    (one record's steps) and side ``b`` (each rank's), named as the cause when some step
    drew and the two sides did not draw alike. torch's generator counts only without
    dropout (which draws from it too). None: no such evidence."""
    seen_a = _per_step(a, upto)
    seen_b = [_per_step(steps, upto) for steps in b]
    found = []
    for gen in ("python", "numpy", "torch"):
        if gen == "torch" and dropout:
            continue
        ca = [s.get(gen, 0) for s in seen_a]
        cb = [[s.get(gen, 0) for s in rank] for rank in seen_b]
        if not any(ca) and not any(any(r) for r in cb):
            continue
        differs = any(r != ca for r in cb) or not same_world or gen == "torch"
        if differs:
            found.append(f"{_NAMES[gen]} drew {_describe(ca, gen)} in the {label_a} run and "
                         f"{_describe([c for r in cb for c in r], gen)} on each rank of the "
                         f"{label_b} run")
    if not found:
        return None
    why = ("each process draws for its own part of the batch from its own generator, so the "
           "augmented samples differ with the number of processes; this difference is "
           "expected" if not same_world else
           "the two runs did not draw alike (a draw one makes and the other does not: "
           "an import or a library drawing after a resume, or state not restored)")
    return ("Random augmentation (or anything random in the loop) draws from the global "
            f"generators: {'; '.join(found)}. At the first differing step {why}. Draw from a "
            "generator of your own seeded per sample (e.g. torch.Generator().manual_seed("
            "seed * 1_000_003 + index)), or verify with augmentation off to check the rest.")
