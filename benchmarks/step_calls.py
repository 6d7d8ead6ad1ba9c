"""The Python calls a training step makes, counted (valid on a loaded machine, unlike a timing).

Runs one loop at 1 or 2 gloo ranks, 5 steps to warm up, then ``--steps`` steps under
cProfile on every rank, and prints rank 0's Python calls a step and the functions called
most. Loops: ``hand`` (hand-written DDP), ``splitsync`` (run.model/loader/backward/step),
``armed`` (the same, armed for preemption as after ``run.resume``), ``counted``
(``run.backward(loss, count=len(y))``), ``realistic`` (counted and armed). Diff two loops'
listings (``--lines 400``) to see what one step of one costs the other.

    PYTHONPATH=src python benchmarks/step_calls.py --loop armed [--procs 2]
        [--workload W1] [--steps 200] [--lines 25]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from typing import Any

import torch
import torch.nn.functional as F

LOOPS = ("hand", "splitsync", "armed", "counted", "realistic")


def _build(run: Any, loop: str, workload: str) -> tuple[Any, Any]:
    """The loop object, and the preemption handling to close after it (or None)."""
    from splitsync.bench.registry import build_loop
    from splitsync.bench.workloads import make_workload
    from splitsync.run.preempt import preemption_for

    ctx = {"run": run, "device": run.device, "rank": run.rank, "world_size": run.world_size,
           "seed": run.seed}
    wl = make_workload(workload)
    torch.manual_seed(0)
    base = wl.build()
    built = build_loop("hand" if loop == "hand" else "splitsync", wl, base, ctx)
    if loop in ("counted", "realistic"):
        def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
            run.backward(F.cross_entropy(built.model(x), y), count=len(y))
            run.step(built.opt)

        built.train_step = train_step
    armed = None
    if loop in ("armed", "realistic"):
        armed = preemption_for(run.config, run.rank, run.world_size, run._checkpoints,
                               run._generators, run._watch_steps, run._unwatch_steps)
    return built, armed


def _rank(rank: int, world: int, loop: str, workload: str, steps: int, lines: int) -> None:
    import splitsync

    torch.set_num_threads(1)
    with splitsync.init(seed=0) as run:
        built, armed = _build(run, loop, workload)
        built.run(5)  # DDP's first-iteration rebuild and the loader's start, not counted
        try:
            prof = cProfile.Profile()
            prof.enable()
            built.run(steps)
            prof.disable()
            if rank == 0:
                stats = pstats.Stats(prof)
                calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
                print(f"{loop}: {calls / steps:.1f} Python calls a step")
                stats.sort_stats("ncalls").print_stats(lines)
        finally:
            if armed is not None:
                armed.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loop", choices=LOOPS, default="splitsync")
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--workload", default="W1")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lines", type=int, default=25, help="how many functions to list")
    a = p.parse_args()
    from splitsync.testing import spawn

    spawn(_rank, a.procs, a.loop, a.workload, a.steps, a.lines, timeout=3600)


if __name__ == "__main__":
    main()
