"""Step time of a splitsync loop armed for preemption, against hand-written DDP, interleaved.

Two gloo ranks train the overhead benchmark's workloads (W1 tiny MLP, W2 digits CNN) with
the default guards, in one launch: blocks of steps of three loops interleaved in rotating
order (``splitsync.bench.harness.interleave``): hand-written DDP, the splitsync loop, and
the same splitsync loop while its run is armed for preemption (as after ``run.resume``:
signal handlers installed, a thread checking the job's store for a request twice a second;
armed before each of its blocks and disarmed after, so that the other loops run without
the thread). No signal arrives: this is the steady state, which must cost nothing per
step. Prints per loop the median and mean step time (the thread's wake-ups are rare slow
steps: the mean shows them, the median does not) and the median of per-round ratios
against hand-written DDP, with its 95% interval.

    PYTHONPATH=src python benchmarks/preempt_overhead.py [--workloads W1,W2] [--rounds 60]
        [--block 50] [--calibrate]   (A/A: the "armed" loop not armed, the method's own bias)
        [--realistic] [--pair]

``--pair``: the splitsync loop and the same loop armed only (no hand-written DDP), so that
the same time buys more rounds of the one comparison the bar is about; ratios are to the
unarmed loop, with their 95% interval, per round and with all steps pooled; and CPU a step
(rank 0's main thread, plus the watching thread's CPU in armed blocks), which does not wait
on the other rank and so moves less than a step's wall time (W1: an interval of about
+-0.5% where the wall time's is +-2-3%).

``--realistic``: the loop a user writes (``run.backward(loss, count=len(y))``, armed)
against hand-written DDP, two loops only: a run keeps counted windows from its first
``count=`` on, so the plain splitsync loop cannot share the launch.
"""

from __future__ import annotations

import argparse
import time
from statistics import fmean
from typing import Any

import torch
import torch.nn.functional as F

from splitsync.testing import spawn


def _counted(loop: Any, run: Any) -> Any:
    """``loop``'s steps with ``count=`` on its backward (W1 and W2: a mean over samples)."""
    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        run.backward(F.cross_entropy(loop.model(x), y), count=len(y))
        run.step(loop.opt)

    loop.train_step = train_step
    return loop


def _aligned(fn: Any) -> Any:
    """``fn``'s steps, begun together on every rank: each block's first step would otherwise
    also time the other rank's work since its last block (arming: a store round trip, a
    thread started), a skew that one step of a 50-step block of W1 turns into percents."""
    import torch.distributed as dist

    def run(steps: int) -> list[float]:
        dist.barrier()
        return fn(steps)

    return run


def _rank(rank: int, world: int, workloads: list[str], rounds: int, block: int,
          calibrate: bool, realistic: bool = False, pair: bool = False) -> list[dict] | None:
    import splitsync
    from splitsync.bench.harness import interleave, paired_ratios
    from splitsync.bench.registry import build_loop
    from splitsync.bench.workloads import make_workload
    from splitsync.run.preempt import preemption_for

    torch.set_num_threads(1)
    out = []
    thread_cpu = [0.0, 0.0]  # the watching thread's CPU seconds, the armed seconds
    with splitsync.init(seed=0) as run:
        ctx: dict[str, Any] = {"run": run, "device": run.device, "rank": run.rank,
                               "world_size": run.world_size, "seed": run.seed}
        for name in workloads:
            wl = make_workload(name)
            torch.manual_seed(0)
            base = wl.build()
            hand = build_loop("hand", wl, base, ctx)
            plain = build_loop("splitsync", wl, base, ctx)

            cpu: dict[str, list[float]] = {"splitsync": [], "splitsync, armed": []}

            def armed(steps: int, loop: Any = plain,
                      cpu: dict[str, list[float]] = cpu) -> list[float]:
                if calibrate:
                    return _aligned(_cpu_of(loop.run, cpu["splitsync, armed"]))(steps)
                # what run.resume arms (made and ended outside the timed steps)
                p = preemption_for(run.config, run.rank, run.world_size, run._checkpoints,
                                   run._generators, run._watch_steps, run._unwatch_steps)
                began = time.perf_counter()
                try:
                    return _aligned(_cpu_of(loop.run, cpu["splitsync, armed"]))(steps)
                finally:
                    if p is not None:
                        watcher = _thread_cpu(p._watcher._thread)
                        thread_cpu[0] += watcher
                        thread_cpu[1] += time.perf_counter() - began
                        cpu["splitsync, armed"][-1] += watcher / steps  # the thread's too
                        p.close()

            # fixed rounds and blocks: every rank takes the same decisions, nothing timed
            if realistic:
                counted = _counted(plain, run)
                loops = {"hand-written DDP": _aligned(hand.run),
                         "splitsync, count= + armed": lambda steps, c=counted: armed(steps, c)}
            elif pair:
                loops = {"splitsync": _aligned(_cpu_of(plain.run, cpu["splitsync"])),
                         "splitsync, armed": armed}
            else:
                loops = {"hand-written DDP": _aligned(hand.run),
                         "splitsync": _aligned(plain.run), "splitsync, armed": armed}
            blocks = interleave(loops, rounds=rounds, block=block, warmup=2)
            out += _rows(blocks, next(iter(loops)), name)
            if pair:  # the warm-up rounds' blocks are not among the timed ones
                out.append(_cpu_row(cpu["splitsync, armed"][-len(blocks["splitsync"]):],
                                    cpu["splitsync"][-len(blocks["splitsync"]):], name))
            if not (realistic or pair):
                armed_vs_plain = paired_ratios(blocks["splitsync, armed"], blocks["splitsync"])
                out.append({"workload": name, "loop": "armed / splitsync",
                            "ratio": sorted(armed_vs_plain)[len(armed_vs_plain) // 2]})
    if thread_cpu[1] > 0:
        out.append({"workload": "all", "loop": "the watching thread's CPU per armed second "
                    f"(us; rank {rank})", "ratio": 1e6 * thread_cpu[0] / thread_cpu[1]})
    return out if rank == 0 else None


def _cpu_of(run_steps: Any, into: list[float]) -> Any:
    """``run_steps``, noting the main thread's CPU seconds a step of each block in ``into``."""
    def run(steps: int) -> list[float]:
        began = time.thread_time()
        times = run_steps(steps)
        into.append((time.thread_time() - began) / steps)
        return times

    return run


def _cpu_row(armed: list[float], plain: list[float], workload: str) -> dict:
    """Armed against unarmed in CPU a step (the main thread's, plus the watching thread's
    for the armed blocks): median of per-round ratios with its 95% interval. A step's CPU
    moves less from block to block than its wall time, which waits on the other rank."""
    from splitsync.bench.harness import median, median_ci

    ratios = [a / p for a, p in zip(armed, plain, strict=True)]
    lo, hi = median_ci(ratios)
    return {"workload": workload, "loop": "CPU a step, armed / unarmed (rank 0: main thread, "
            "plus the watching thread when armed)", "ratio": median(ratios),
            "cpu": (lo, hi, 1e6 * median(plain), 1e6 * median(armed))}


def _rows(blocks: dict[str, list[list[float]]], baseline: str, workload: str) -> list[dict]:
    """Each loop's summary against ``baseline``, with its mean step time (the thread's
    wake-ups are rare slow steps: the mean shows them, the median does not) and the ratio
    of all its steps' median to the baseline's (``pooled_ratio``: with short blocks the
    per-round ratios are noisy; the pooled median uses every step at once)."""
    from splitsync.bench.harness import pooled_ratio, summarize

    rows = [s.as_dict() for s in summarize(blocks, baseline)]
    for row in rows:
        name = str(row["loop"])
        row["mean_ms"] = 1e3 * fmean(t for b in blocks[name] for t in b)
        row["workload"] = workload
        row["pooled"] = pooled_ratio(blocks[name], blocks[baseline])
    return rows


def _thread_cpu(thread: Any) -> float:
    """CPU seconds ``thread`` has used so far (Linux: /proc; 0 elsewhere): the armed
    thread's whole cost, which the step times can only show through their noise."""
    try:  # schedstat: nanoseconds on the CPU (stat's ticks are 10 ms, too coarse here)
        with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError, TypeError):
        return 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="W1,W2")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--block", type=int, default=50)
    p.add_argument("--calibrate", action="store_true")
    p.add_argument("--realistic", action="store_true")
    p.add_argument("--pair", action="store_true")
    a = p.parse_args()
    rows = spawn(_rank, 2, a.workloads.split(","), a.rounds, a.block, a.calibrate,
                 a.realistic, a.pair, timeout=3600)[0]
    base = "the unarmed splitsync loop" if a.pair else "hand-written DDP"
    print(f"| workload | loop | median ms | mean ms | ratio to {base}: median of rounds (95% CI) "
          f"| all steps pooled (95% CI) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "cpu" in r:
            lo, hi, plain_us, armed_us = r["cpu"]
            print(f"| {r['workload']} | {r['loop']} | {plain_us:.1f} us unarmed | "
                  f"{armed_us:.1f} us armed | {r['ratio']:.4f} ({lo:.4f}-{hi:.4f}) | |")
            continue
        if "median_ms" not in r:
            print(f"| {r['workload']} | {r['loop']} | | | {r['ratio']:.4f} | |")
            continue
        ci = f"{r['ratio']:.4f} ({r['ratio_lo']:.4f}-{r['ratio_hi']:.4f})"
        pooled = "{:.4f} ({:.4f}-{:.4f})".format(*r["pooled"])
        print(f"| {r['workload']} | {r['loop']} | {r['median_ms']:.3f} | {r['mean_ms']:.3f} | "
              f"{ci} | {pooled} |")


if __name__ == "__main__":
    main()
