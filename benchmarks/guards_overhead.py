"""Cost of splitsync's runtime guards (and of debug mode) per training step.

Two gloo ranks train the same small CNN through Run handles over one process group: one with
guards on (the default), one with ``guards=False``. Blocks of steps are interleaved in one
launch, in an order that rotates every round, so machine noise hits all variants alike; the
report gives each variant's median step time, the ratio of medians and the median of the
per-round ratios. Debug mode (desync recording) is measured the same way against guards off.
Each step: forward, run.backward, run.step and a run.mean(loss) for logging.

    PYTHONPATH=src python benchmarks/guards_overhead.py [--steps 30] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

import splitsync
from splitsync.observers.guards.desync import Recorder
from splitsync.testing import spawn


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def _block(run: splitsync.Run, model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
           y: torch.Tensor, steps: int) -> float:
    dist.barrier()  # the same plain barrier for every variant: equal skew between ranks
    start = time.perf_counter()
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        run.backward(loss)
        run.step(opt)
        run.mean(loss.detach())
    return (time.perf_counter() - start) / steps


def _rank(rank: int, world: int, steps: int, repeats: int, debug: bool,
          calibrate: bool) -> dict[str, list[float]]:
    # calibrate: an A/A run (both variants guards off) shows the method's own bias and noise
    runs = {"guards off": splitsync.init(seed=0, guards=False),
            "guards on": splitsync.init(seed=0, guards=not calibrate)}
    recorder = None
    if debug:
        runs["debug mode"] = splitsync.init(seed=0, guards=True, debug=True)
        recorder = next(o for o in runs["debug mode"].observers if isinstance(o, Recorder))
        recorder.uninstall()  # debug patches torch.distributed globally: on in its blocks only
    x = torch.randn(32, 1, 8, 8)
    y = torch.randint(0, 10, (32,))
    setups = {}
    for name, run in runs.items():
        model = run.model(_net())
        setups[name] = (run, model, torch.optim.SGD(model.parameters(), lr=0.01))
    times: dict[str, list[float]] = {name: [] for name in runs}
    for name in runs:
        _block(*setups[name], x, y, 3)  # warm-up
    names = list(runs)
    for i in range(repeats):
        order = names[i % len(names):] + names[:i % len(names)]  # rotate: no variant always first
        for name in order:
            if name == "debug mode" and recorder is not None:
                recorder.install()
            times[name].append(_block(*setups[name], x, y, steps))
            if name == "debug mode" and recorder is not None:
                recorder.uninstall()
    for run in runs.values():
        run.close(clean=False)
    return times


def _per_call_cost(calls: int = 200_000) -> float:
    """Seconds the guards add per step, timed in isolation (no noise from communication):
    one guarded forward plus two guarded calls (run.backward and run.mean)."""
    from splitsync.observers.guards import Watch, guard_forward

    plain = nn.Identity()
    guarded = guard_forward(nn.Identity(), torch.device("cpu"))
    watch = Watch(0, 1, None, None, None)  # type: ignore[arg-type]
    x = torch.zeros(1)

    def noop(t: torch.Tensor) -> torch.Tensor:
        return t

    def best(fn: object) -> float:
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn()  # type: ignore[operator]
            runs.append((time.perf_counter() - start) / calls)
        return min(runs)

    forward = best(lambda: guarded(x)) - best(lambda: plain(x))
    wrapped = best(lambda: watch.call("all_reduce", noop, x)) - best(lambda: noop(x))
    return max(0.0, forward) + 2 * max(0.0, wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="steps per block")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--no-debug", action="store_true", help="measure guards only")
    parser.add_argument("--calibrate", action="store_true",
                        help="A/A: the 'guards on' variant runs with guards off too")
    args = parser.parse_args()
    times = spawn(_rank, 2, args.steps, args.repeats, not args.no_debug, args.calibrate,
                  timeout=600)[0]
    from rich.console import Console
    from rich.table import Table

    base = statistics.median(times["guards off"])
    table = Table(title=f"guard overhead, 2 gloo ranks, {args.repeats} interleaved rounds of "
                        f"{args.steps} steps (rank 0)")
    for col in ("variant", "median step (ms)", "ratio vs guards off"):
        table.add_column(col)
    for name, values in times.items():
        med = statistics.median(values)
        table.add_row(name, f"{med * 1e3:.3f}", f"{med / base:.4f}")
    Console().print(table)
    added = _per_call_cost()
    print(f"guards' own work per step, timed in isolation: {added * 1e6:.2f} us = "
          f"{100 * added / base:.3f}% of the guards-off step")
    for name in [n for n in times if n != "guards off"]:
        paired = [a / b for a, b in zip(times[name], times["guards off"], strict=True)]
        print(f"{name} / guards off, median of per-round ratios: {statistics.median(paired):.4f}")


if __name__ == "__main__":
    main()
