"""Side-by-side timing: run loops in alternating blocks and compare them pair by pair.

The machine's speed drifts (other processes, frequency, caches). Two loops measured in
separate runs differ by that drift; two blocks measured back to back see nearly the same
machine. So each round runs one block of every loop (the order rotates from round to
round), and a loop's ratio to the baseline is the median over rounds of
median(block of loop) / median(block of baseline).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from splitsync.tools.tables import markdown_table

__all__ = ["median", "median_ci", "percentile", "round_order", "interleave", "paired_ratios",
           "pooled_ratio", "bootstrap_interval", "LoopSummary", "summarize", "markdown_table"]


def median(xs: Sequence[float]) -> float:
    """The median (mean of the middle two for an even count)."""
    if not xs:
        raise ValueError("median of no values")
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks."""
    if not xs:
        raise ValueError("percentile of no values")
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median_ci(xs: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free ~95% confidence interval of the median (binomial order statistics)."""
    s = sorted(xs)
    n = len(s)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return s[lo], s[hi]


def round_order(names: Sequence[str], r: int) -> list[str]:
    """The order of round ``r``: rounds 2k and 2k+1 run ``names`` rotated by k, the second
    of them reversed (A B C, C B A, B C A, A C B ...), so over every 2n rounds each of n
    loops runs in each position equally often. (Rotating by r and reversing odd rounds
    cancels out for two loops: A B, then B A reversed, is A B again.)"""
    k = (r // 2) % len(names)
    order = [*names[k:], *names[:k]]
    return order[::-1] if r % 2 else order


def interleave(runners: Mapping[str, Callable[[int], list[float]]], *, rounds: int,
               block: int, warmup: int = 1, max_rounds: int | None = None,
               more: Callable[[int], bool] | None = None) -> dict[str, list[list[float]]]:
    """Run every runner for ``block`` steps per round; return per-loop lists of blocks.

    ``warmup`` untimed rounds come first; each round runs the loops in
    :func:`round_order`. After ``rounds`` rounds,
    ``more(done)`` is asked before each further round, up to ``max_rounds`` (e.g. to fill a
    time budget).
    """
    if rounds < 1 or block < 1:
        raise ValueError(f"rounds={rounds}, block={block}: both must be >= 1.")
    names = list(runners)
    blocks: dict[str, list[list[float]]] = {n: [] for n in names}
    last = warmup + max(rounds, max_rounds or 0)
    for r in range(last):
        if r >= warmup + rounds and (more is None or not more(r - warmup)):
            break
        for name in round_order(names, r):
            times = runners[name](block)
            if r >= warmup:
                blocks[name].append(times)
    return blocks


def paired_ratios(blocks: Sequence[Sequence[float]], base: Sequence[Sequence[float]]) -> list[float]:
    """median(block i) / median(baseline block i) for every round i."""
    return [median(a) / median(b) for a, b in zip(blocks, base, strict=True)]


def pooled_ratio(blocks: Sequence[Sequence[float]], base: Sequence[Sequence[float]], *,
                 resamples: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """median(all steps of ``blocks``) / median(all steps of ``base``), with a 95% interval
    from resampling whole rounds (a round's two blocks stay together, so the machine's drift
    stays paired). Short blocks make per-round ratios noisy; the pooled median uses every
    step at once. Seeded: the same blocks give the same interval."""
    if len(blocks) != len(base) or not blocks:
        raise ValueError(f"pooled_ratio: {len(blocks)} and {len(base)} rounds; need the same "
                         f"number, at least one.")

    def ratio(rounds: Sequence[int]) -> float:
        return (median([t for i in rounds for t in blocks[i]])
                / median([t for i in rounds for t in base[i]]))

    return (ratio(range(len(blocks))),
            *bootstrap_interval(len(blocks), ratio, resamples=resamples, seed=seed))


def bootstrap_interval(n: int, statistic: Callable[[Sequence[int]], float], *,
                       resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% interval of ``statistic`` over ``n`` rounds, each resample drawing n round
    indices with replacement. Seeded: the same data, the same interval."""
    rng = random.Random(seed)
    boots = sorted(statistic(rng.choices(range(n), k=n)) for _ in range(resamples))
    return boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1]


@dataclass(frozen=True)
class LoopSummary:
    """One loop's step-time figures and its ratio to the baseline of the same run."""

    loop: str
    median_ms: float
    p90_ms: float
    ratio: float  # median of per-round ratios of block medians
    ratio_lo: float  # 95% confidence interval of that median (order statistics)
    ratio_hi: float
    rounds: int
    steps: int

    def as_dict(self) -> dict[str, float | int | str]:
        return dict(self.__dict__)


def summarize(blocks: Mapping[str, Sequence[Sequence[float]]], baseline: str) -> list[LoopSummary]:
    """Figures of every loop, baseline first; ratios are relative to ``baseline``."""
    if baseline not in blocks:
        raise ValueError(f"baseline {baseline!r} is not among the loops {sorted(blocks)}")
    out = []
    names = [baseline] + [n for n in blocks if n != baseline]
    for name in names:
        flat = [t for b in blocks[name] for t in b]
        ratios = paired_ratios(blocks[name], blocks[baseline])
        lo, hi = median_ci(ratios)
        out.append(LoopSummary(name, 1e3 * median(flat), 1e3 * percentile(flat, 90),
                               median(ratios), lo, hi, len(ratios), len(flat)))
    return out
