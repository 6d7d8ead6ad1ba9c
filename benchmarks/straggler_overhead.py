"""Cost of the straggler report per training step: the same run with its clock on and off.

Two gloo ranks train the overhead benchmark's workload (W1 by default) through one Run, as
``splitsync bench --sections overhead`` does, with the default guards. Blocks of steps are
interleaved in one launch (``splitsync.bench.harness.interleave``, rotating order); before
each block the straggler clock is attached ("report on", the default) or detached ("report
off"), so both variants share the model, the data and the machine's noise. The report's
own all-reduce cost is zero by construction (it rides on ``run.log``), so the steps here
have no ``run.log``: what is measured is the clock in the per-step path. Prints each
variant's median step time and the median of per-round ratios with its 95% interval.

    PYTHONPATH=src python benchmarks/straggler_overhead.py [--workload W1] [--rounds 200]
        [--calibrate]   (A/A: the clock off in both variants, the method's own bias)
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from splitsync.testing import spawn


def _rank(rank: int, world: int, workload: str, rounds: int, block: int,
          calibrate: bool) -> list[dict] | None:
    import splitsync
    from splitsync.bench.harness import interleave, summarize
    from splitsync.bench.registry import build_loop
    from splitsync.bench.workloads import make_workload
    from splitsync.observers.stragglers import StepClock

    torch.set_num_threads(1)
    with splitsync.init(seed=0) as run:
        clocks = [o for o in run.observers if isinstance(o, StepClock)]
        assert len(clocks) == 1, "the default init attaches one straggler clock"
        clock = clocks[0]
        ctx: dict[str, Any] = {"run": run, "device": run.device, "rank": run.rank,
                               "world_size": run.world_size, "seed": run.seed}
        wl = make_workload(workload)
        torch.manual_seed(0)
        loop = build_loop("splitsync", wl, wl.build(), ctx)

        def on(steps: int) -> list[float]:
            if calibrate:  # A/A: both variants without the clock, the method's own bias
                return off(steps)
            if clock not in run.observers:
                run.add_observer(clock)
            return loop.run(steps)

        def off(steps: int) -> list[float]:
            run.remove_observer(clock)
            return loop.run(steps)

        # fixed rounds and blocks: every rank takes the same decisions, nothing timed
        blocks = interleave({"report off": off, "report on": on}, rounds=rounds, block=block,
                            warmup=2)
        rows = [s.as_dict() for s in summarize(blocks, "report off")]
        return rows if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--calibrate", action="store_true", help="A/A: clock off in both")
    args = parser.parse_args()
    rows = spawn(_rank, 2, args.workload, args.rounds, args.block, args.calibrate,
                 timeout=1800)[0]
    print(f"{args.workload}, 2 gloo ranks, guards on, {args.rounds} rounds x {args.block} steps"
          + (" (A/A calibration)" if args.calibrate else ""))
    for r in rows:
        print(f"  {r['loop']:<11} median {r['median_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  "
              f"ratio {r['ratio']:.4f}x [{r['ratio_lo']:.4f}, {r['ratio_hi']:.4f}]")


if __name__ == "__main__":
    main()
