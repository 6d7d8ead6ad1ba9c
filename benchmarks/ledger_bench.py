"""Cost of the sample ledger per training step, and its size per sample.

Two gloo ranks train the overhead benchmark's workload (W1 by default: a tiny MLP whose
step is so short that any per-step cost shows) through one Run made with
``init(ledger=True)``. Three variants run in interleaved blocks in one launch
(``splitsync.bench.harness.interleave``: every variant in every position equally often):
"ledger off", "ledger off again" (an A/A control: the method's own bias and spread, measured
in the same sitting) and "ledger on". Before each block the ledger is attached or detached
and the loader starts a fresh pass, since the ledger follows the passes it saw begin. All
variants share the model, the data and the machine's noise.

Printed: each variant's median and the median of per-round ratios of block medians with its
95% interval, for the wall time of a step (what the issue's 1% is about) and for the
training thread's CPU time in it (less noisy on a shared machine: waiting for the other rank
or for a core does not count). Then the ledger's own cost in microseconds a step, from a
second interleaved pair of loops that only fetch a batch and call ``run.step`` (no model,
so a microsecond shows; the thread's CPU time), in blocks long enough to include the
ledger's buffered writes. Then its bytes per sample (whole files, both ranks).

    PYTHONPATH=src python benchmarks/ledger_bench.py [--workload W1] [--rounds 700]
        [--block 40] [--light-rounds 100] [--light-block 512]

About 4 minutes for W1 on two busy cores.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from splitsync.testing import spawn

OFF, AA, ON = "ledger off", "ledger off again", "ledger on"


def _rank(rank: int, world: int, workload: str, rounds: int, block: int, light_rounds: int,
          light_block: int, run_dir: str) -> dict[str, Any] | None:
    import splitsync
    from splitsync.bench.harness import interleave, median, median_ci, summarize
    from splitsync.bench.registry import build_loop
    from splitsync.bench.workloads import make_workload
    from splitsync.tools.audit.ledger.recorder import Ledger

    torch.set_num_threads(1)
    with splitsync.init(seed=0, ledger=True, run_dir=run_dir) as run:
        ledger = next(o for o in run.observers if isinstance(o, Ledger))
        ctx: dict[str, Any] = {"run": run, "device": run.device, "rank": run.rank,
                               "world_size": run.world_size, "seed": run.seed}
        wl = make_workload(workload)
        torch.manual_seed(0)
        loop = build_loop("splitsync", wl, wl.build(), ctx)

        cpu: dict[str, list[list[float]]] = {OFF: [], AA: [], ON: []}

        def variant(name: str, attached: bool, train: bool):  # type: ignore[no-untyped-def]
            def run_block(steps: int) -> list[float]:
                if attached and ledger not in run.observers:
                    run.add_observer(ledger)
                elif not attached:
                    run.remove_observer(ledger)
                loop._it = loop._epoch_iter()  # a fresh pass: the ledger follows it iff attached
                return train_steps(name, steps) if train else fetch_and_step(steps)
            return run_block

        def train_steps(name: str, steps: int) -> list[float]:
            # Loop.run with a second clock: this thread's CPU time, which excludes time spent
            # waiting (for the other rank, for a core another process holds), so it is far
            # less noisy; the ledger's work is all on this thread
            wall, used = [], []
            clock, thread = time.perf_counter, time.thread_time
            for _ in range(steps):
                t0, c0 = clock(), thread()
                try:
                    x, y = next(loop._it)
                except StopIteration:
                    loop.epoch += 1
                    loop._it = loop._epoch_iter()
                    x, y = next(loop._it)
                loop.train_step(x, y)
                used.append(thread() - c0)
                wall.append(clock() - t0)
            cpu[name].append(used)
            return wall

        def fetch_and_step(steps: int) -> list[float]:
            # The loop without its model: what the ledger adds is a larger share of this.
            # This thread's CPU time, not wall time: the ledger's work is all on this thread,
            # and time spent waiting for a core other processes hold does not count.
            clock = time.thread_time
            t0 = clock()
            for _ in range(steps):
                try:
                    next(loop._it)
                except StopIteration:
                    loop.epoch += 1
                    loop._it = loop._epoch_iter()
                    next(loop._it)
                run.step(loop.opt)
            return [(clock() - t0) / steps]  # the block's mean: its writes included

        blocks = interleave({OFF: variant(OFF, False, True), AA: variant(AA, False, True),
                             ON: variant(ON, True, True)}, rounds=rounds, block=block, warmup=2)
        rows = [s.as_dict() for s in summarize(blocks, OFF)]
        cpu = {k: v[-rounds:] for k, v in cpu.items()}  # the warmup rounds left out
        cpu_rows = [s.as_dict() for s in summarize(cpu, OFF)]
        light = interleave({OFF: variant(OFF, False, False), ON: variant(ON, True, False)},
                           rounds=light_rounds, block=light_block, warmup=2)
        diffs = [1e6 * (a[0] - b[0]) for a, b in zip(light[ON], light[OFF], strict=True)]
        lo, hi = median_ci(diffs)
        off_us = 1e6 * median([b[0] for b in light[OFF]])
        cost = {"us": median(diffs), "lo": lo, "hi": hi, "off_us": off_us}
        batch = wl.batch_size
        run.add_observer(ledger)  # closes its file at run.close
    if rank != 0:
        return None
    from splitsync.tools.audit.ledger.format import read_file

    files = list(Path(run_dir, "ledger").rglob("*.ledger"))
    size = sum(f.stat().st_size for f in files)
    samples = sum(len(r.ids) for f in files for k, r in read_file(f).records if k == "S")
    return {"rows": rows, "cpu_rows": cpu_rows, "cost": cost, "bytes": size, "samples": samples, "batch": batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--rounds", type=int, default=700)
    parser.add_argument("--block", type=int, default=40)
    parser.add_argument("--light-rounds", type=int, default=100)
    parser.add_argument("--light-block", type=int, default=512)
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = spawn(_rank, 2, args.workload, args.rounds, args.block, args.light_rounds,
                    args.light_block, tmp, timeout=1800)[0]
    print(f"{args.workload}, 2 gloo ranks, batch {out['batch']} per rank, {args.rounds} rounds "
          f"x {args.block} steps, 3 variants interleaved ({time.perf_counter() - t0:.0f} s)")
    for title, rows in (("step time (wall)", out["rows"]),
                        ("training thread's CPU time a step", out["cpu_rows"])):
        print(f" {title}:")
        for r in rows:
            print(f"  {r['loop']:<16} median {r['median_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms"
                  f"  ratio {r['ratio']:.4f}x [{r['ratio_lo']:.4f}, {r['ratio_hi']:.4f}]")
    c = out["cost"]
    step_ms = out["rows"][0]["median_ms"]
    print(f"  ledger's own cost: {c['us']:.2f} us a step [{c['lo']:.2f}, {c['hi']:.2f}] = "
          f"{c['us'] / (10 * step_ms):.2f}% of the median step (fetch + run.step without a "
          f"model: {c['off_us']:.1f} us CPU a step off; {args.light_rounds} rounds x "
          f"{args.light_block} steps, writes included)")
    if out["samples"]:
        print(f"  ledger size: {out['bytes']} bytes for {out['samples']} samples = "
              f"{out['bytes'] / out['samples']:.2f} bytes a sample (all files, both ranks)")


if __name__ == "__main__":
    main()
