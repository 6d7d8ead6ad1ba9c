"""Hand-written DDP against the splitsync loop in separate launches, as a user runs them.

The interleaved benchmarks (``overhead.py``, ``preempt_overhead.py``) run every loop in one
process that ``splitsync.init`` set up, so a cost that splitsync adds to the whole process (a
thread, a second process group, a setting) slows the hand-written loop there too and cancels
out. Here each loop is its own ``torchrun --standalone`` launch (``OMP_NUM_THREADS=1``), in
an order that rotates every round (``splitsync.bench.harness.round_order``, as ``interleave``):

- ``hand``: ``init_process_group("gloo")`` and DDP, nothing of splitsync imported;
- ``hand-in-init``: the same loop in a process that ``splitsync.init`` set up (the
  process-wide costs alone);
- ``splitsync``: ``run.model``, ``run.loader``, ``run.backward``, ``run.step``;
- ``splitsync-noguards``: the same with ``init(guards=False)``.

Per launch it records rank 0's median and mean step time and, over the measured steps, each
rank's CPU time split by thread (``/proc/self/task/*/schedstat``). A launch's median step
moves by 10-20% from launch to launch on 2 cores; the main thread's CPU a step (the loop's
own work) moves by a few percent, gloo's I/O thread's with the scheduling. Prints per loop the median and mean of the launch medians, the median
of per-round ratios to the first loop with a bootstrap 95% interval, CPU a step (all ranks)
and the CPU of each kind of thread.

    PYTHONPATH=src python benchmarks/launches.py [--loops hand,splitsync] [--workload W1]
        [--procs 2] [--rounds 12] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import fmean, median
from typing import Any

LOOPS = ("hand", "hand-in-init", "splitsync", "splitsync-noguards")
_WARMUP = 50


def _threads() -> dict[str, tuple[str, int]]:
    """Every thread of this process: its name and its nanoseconds on a CPU so far."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
        out[tid] = (name, ns)
    return out


def _measure(loop: Any, steps: int) -> dict[str, Any]:
    """``loop``'s measured steps after a warm-up, and the CPU each kind of thread used."""
    loop.run(_WARMUP)
    before = _threads()
    times = loop.run(steps)
    cpu: Counter[str] = Counter()
    for tid, (name, ns) in _threads().items():
        cpu[name] += (ns - before.get(tid, (name, 0))[1]) / 1e9
    return {"median": median(times), "mean": fmean(times), "cpu": dict(cpu)}


def _worker(kind: str, workload: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from splitsync.bench.registry import build_loop
    from splitsync.bench.workloads import make_workload

    wl = make_workload(workload)
    torch.manual_seed(0)
    base = wl.build()
    if kind == "hand":
        dist.init_process_group("gloo")
        ctx = {"device": torch.device("cpu"), "rank": dist.get_rank(),
               "world_size": dist.get_world_size(), "seed": 0}
        result = _measure(build_loop("hand", wl, base, ctx), steps)
        rank = dist.get_rank()
        dist.destroy_process_group()
    else:
        import splitsync

        with splitsync.init(seed=0, guards=kind != "splitsync-noguards") as run:
            ctx = {"run": run, "device": run.device, "rank": run.rank,
                   "world_size": run.world_size, "seed": run.seed}
            loop_kind = "hand" if kind == "hand-in-init" else "splitsync"
            result = _measure(build_loop(loop_kind, wl, base, ctx), steps)
            rank = run.rank
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def _launch(kind: str, a: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    folder.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={a.procs}", __file__, "--worker", kind, "--workload", a.workload,
           "--steps", str(a.steps), "--out", str(folder)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    ranks = sorted(folder.glob("rank*.json"))
    if len(ranks) != a.procs:  # every rank writes before it exits: a missing one failed
        raise SystemExit(f"{kind}: {len(ranks)} of {a.procs} ranks reported "
                         f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
    return [json.loads(p.read_text()) for p in ranks]


def _report(results: dict[str, list[list[dict[str, Any]]]], steps: int) -> None:
    from splitsync.bench.harness import bootstrap_interval

    base = next(iter(results))
    print(f"| loop | median of launch medians ms | mean of launch medians ms | mean step ms | "
          f"ratio to {base} (95% CI) | CPU ms a step, all ranks | CPU by thread, ms a step |")
    print("|---|---|---|---|---|---|---|")
    for name, launches in results.items():
        medians = [1e3 * ranks[0]["median"] for ranks in launches]
        ratios = [ranks[0]["median"] / b[0]["median"]
                  for ranks, b in zip(launches, results[base], strict=True)]
        lo, hi = bootstrap_interval(len(ratios), lambda rounds, x=ratios: median(
            [x[i] for i in rounds]), resamples=4000)
        by_thread: Counter[str] = Counter()
        for ranks in launches:
            for r in ranks:
                by_thread.update({k: 1e3 * v / steps / len(launches) for k, v in r["cpu"].items()})
        threads = ", ".join(f"{k} {v:.3f}" for k, v in by_thread.most_common() if v >= 0.0005)
        print(f"| {name} | {median(medians):.3f} | {fmean(medians):.3f} | "
              f"{1e3 * fmean(r[0]['mean'] for r in launches):.3f} | "
              f"{median(ratios):.3f} ({lo:.3f}-{hi:.3f}) | {sum(by_thread.values()):.3f} | "
              f"{threads} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", default="hand,splitsync")
    p.add_argument("--workload", default="W1")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--worker", choices=LOOPS, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return _worker(a.worker, a.workload, a.steps, a.out)
    from splitsync.bench.harness import round_order  # here: the "hand" worker imports none

    loops = a.loops.split(",")
    if unknown := set(loops) - set(LOOPS):
        raise SystemExit(f"--loops: unknown {sorted(unknown)}; choose from {', '.join(LOOPS)}.")
    results: dict[str, list[list[dict[str, Any]]]] = {n: [] for n in loops}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name in round_order(loops, r):  # each loop in each position equally often
                results[name].append(_launch(name, a, Path(tmp, f"{name}-{r}")))
            print(f"round {r + 1}/{a.rounds}: " + ", ".join(
                f"{n} {1e3 * results[n][-1][0]['median']:.3f} ms" for n in loops), flush=True)
    print(f"\n{a.workload}, {a.procs} processes, {a.rounds} rounds of {a.steps} steps, "
          f"{time.perf_counter() - began:.0f} s\n")
    _report(results, a.steps)


if __name__ == "__main__":
    main()
