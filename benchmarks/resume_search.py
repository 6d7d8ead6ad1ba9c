"""A randomized search for kill-and-resume configurations that do not resume exactly.

Draws ``--configs`` configurations (seeded, so a search can be repeated): dataset sizes
3-400 the world size does not divide, world sizes 1-4, batch 1-16, shuffle and drop_last
on or off, accumulate 1-3, map-style data or a stream of 1-6 shards, a checkpoint at a
random micro-batch (inside an accumulation window too) with 0-3 micro-batches lost after
it, and a resume at the same world size or (``--other`` of them) at another one. Each runs
on real gloo groups (``benchmarks/resumekit.py``): at the same world size the resumed run
must end bit-equal to the uninterrupted one, at another every sample must be trained once
with DistributedSampler's padding. Prints every configuration and what differed, then how
many were exact.

    OMP_NUM_THREADS=1 python benchmarks/resume_search.py [--configs 60] [--seed 0]
        [--other 0.25] [--json results.json]

Configurations at the same world size run several to a spawn (one process group per world
size and batch of configurations), so the search costs mostly training, not starting ranks.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from resumekit import Config, as_dict, check, check_all, saves, with_cuts  # noqa: E402


def draw(rng: random.Random, other: float) -> Config:
    """A configuration whose first run saves (one that never does tests nothing)."""
    while not saves(cfg := _draw(rng, other)):
        pass
    return cfg


def _draw(rng: random.Random, other: float) -> Config:
    world = rng.randint(1, 4)
    n = rng.randint(3, 400)
    while world > 1 and n % world == 0:
        n = rng.randint(3, 400)
    stream = rng.random() < 0.3
    new_world = None
    if rng.random() < other:
        new_world = rng.choice([w for w in range(1, 5) if w != world])
    cfg = Config(n=n, world=world, batch=rng.randint(1, 16), shuffle=rng.random() < 0.5,
                 drop_last=rng.random() < 0.5, accumulate=rng.randint(1, 3), stream=stream,
                 shards=rng.randint(1, 6) if stream else 1, new_world=new_world)
    return with_cuts(cfg, rng.uniform(0.05, 0.95), rng.randint(0, 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--other", type=float, default=0.25,
                    help="the share resumed at another world size")
    ap.add_argument("--group", type=int, default=6, help="same-world configs per spawn")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cfgs = [draw(rng, args.other) for _ in range(args.configs)]
    results: dict[int, list[str]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for world in range(1, 5):  # same world size: several configurations per spawn
            same = [i for i, c in enumerate(cfgs) if c.world == world and c.new_world is None]
            for k in range(0, len(same), args.group):
                part = same[k:k + args.group]
                try:
                    found = check_all([cfgs[i] for i in part], f"{tmp}/w{world}-{k}",
                                      timeout=1800)
                except Exception as exc:  # a crash or hang: every config of the spawn
                    found = [[f"{type(exc).__name__}: {exc}".splitlines()[0]]] * len(part)
                for i, problems in zip(part, found, strict=True):
                    results[i] = problems
                    _report(i, cfgs[i], problems)
        for i, c in enumerate(cfgs):
            if c.new_world is None:
                continue
            try:
                results[i] = check(c, f"{tmp}/o{i}", timeout=900)
            except Exception as exc:
                results[i] = [f"{type(exc).__name__}: {exc}".splitlines()[0]]
            _report(i, c, results[i])
    exact = sum(1 for p in results.values() if not p)
    same = [i for i, c in enumerate(cfgs) if c.new_world is None]
    uneven = [i for i in same if not cfgs[i].stream and not cfgs[i].drop_last
              and cfgs[i].world > 1]
    print(f"\n{exact} of {len(cfgs)} configurations resumed exactly "
          f"({sum(1 for i in same if not results[i])} of {len(same)} at the same world size, "
          f"bit-equal; {exact - sum(1 for i in same if not results[i])} of "
          f"{len(cfgs) - len(same)} at another world size, every sample once); map-style "
          f"without drop_last at 2-4 ranks (padded): "
          f"{sum(1 for i in uneven if not results[i])} of {len(uneven)}; "
          f"{time.monotonic() - t0:.0f}s")
    if args.json is not None:
        args.json.write_text(json.dumps(
            [{"config": as_dict(c), "problems": results[i]} for i, c in enumerate(cfgs)],
            indent=1))


def _report(i: int, cfg: Config, problems: list[str]) -> None:
    verdict = "exact" if not problems else "; ".join(problems[:3])
    print(f"[{i:3d}] {cfg.describe()}: {verdict}", flush=True)


if __name__ == "__main__":
    main()
