"""Cost of the sample ledger per training step, and its size per sample.

Two gloo ranks train the overhead benchmark's workload (W1 by default: a tiny MLP whose
step is so short that any per-step cost shows) through one Run made with
``init(ledger=True)``. Blocks of steps are interleaved in one launch
(``splitsync.bench.harness.interleave``, rotating order); before each block the ledger is
attached ("ledger on") or detached ("ledger off") and the loader starts a fresh pass, since
a pass decides at its start whether it reports its batches' sample ids. Both variants share
the model, the data and the machine's noise. Prints each variant's median step time, the
median of per-round ratios with its 95% interval, and the ledger's bytes per sample.

    PYTHONPATH=src python benchmarks/ledger_bench.py [--workload W1] [--rounds 100]
        [--calibrate]   (A/A: the ledger off in both variants, the method's own bias)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from splitsync.testing import spawn


def _rank(rank: int, world: int, workload: str, rounds: int, block: int, calibrate: bool,
          run_dir: str) -> dict[str, Any] | None:
    import splitsync
    from splitsync.bench.harness import interleave, summarize
    from splitsync.bench.registry import build_loop
    from splitsync.bench.workloads import make_workload
    from splitsync.tools.ledger.recorder import Ledger

    torch.set_num_threads(1)
    with splitsync.init(seed=0, ledger=True, run_dir=run_dir) as run:
        ledger = next(o for o in run.observers if isinstance(o, Ledger))
        ctx: dict[str, Any] = {"run": run, "device": run.device, "rank": run.rank,
                               "world_size": run.world_size, "seed": run.seed}
        wl = make_workload(workload)
        torch.manual_seed(0)
        loop = build_loop("splitsync", wl, wl.build(), ctx)

        def on(steps: int) -> list[float]:
            if calibrate:
                return off(steps)
            if ledger not in run.observers:
                run.add_observer(ledger)
            loop._it = loop._epoch_iter()  # a fresh pass, which reports its sample ids
            return loop.run(steps)

        def off(steps: int) -> list[float]:
            run.remove_observer(ledger)
            loop._it = loop._epoch_iter()
            return loop.run(steps)

        blocks = interleave({"ledger off": off, "ledger on": on}, rounds=rounds, block=block,
                            warmup=2)
        rows = [s.as_dict() for s in summarize(blocks, "ledger off")]
        batch = wl.batch_size
        run.add_observer(ledger)  # closes its file at run.close
    if rank != 0:
        return None
    from splitsync.tools.ledger.format import read_file

    files = list(Path(run_dir, "ledger").rglob("*.ledger"))
    size = sum(f.stat().st_size for f in files)
    samples = sum(len(r.ids) for f in files for k, r in read_file(f).records if k == "S")
    return {"rows": rows, "bytes": size, "samples": samples, "batch": batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--calibrate", action="store_true", help="A/A: ledger off in both")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = spawn(_rank, 2, args.workload, args.rounds, args.block, args.calibrate, tmp,
                    timeout=1800)[0]
    print(f"{args.workload}, 2 gloo ranks, batch {out['batch']} per rank, {args.rounds} rounds "
          f"x {args.block} steps" + (" (A/A calibration)" if args.calibrate else ""))
    for r in out["rows"]:
        print(f"  {r['loop']:<11} median {r['median_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  "
              f"ratio {r['ratio']:.4f}x [{r['ratio_lo']:.4f}, {r['ratio_hi']:.4f}]")
    if out["samples"]:
        print(f"  ledger size: {out['bytes']} bytes for {out['samples']} samples = "
              f"{out['bytes'] / out['samples']:.2f} bytes a sample (all files, both ranks)")


if __name__ == "__main__":
    main()
