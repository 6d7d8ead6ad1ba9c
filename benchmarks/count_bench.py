"""Cost of ``run.backward(loss, count=n)`` per training step, on the overhead benchmark's
workload.

One process (a plain module) and two gloo ranks (DDP) train W1 by default (the tiny MLP
whose step is so short that any per-step cost shows) through one Run. Three loops run in
interleaved blocks in one launch (``splitsync.bench.harness.interleave``: every loop in
every position equally often), each on its own copy of the model, optimizer and loader:
"plain" (``run.backward(loss)``), "plain again" (the same loop on another copy: an A/A
control, the method's own bias and spread in the same sitting) and "count="
(``run.backward(loss, count=len(y))``: W1's loss is a mean over the batch's samples). At 2
processes a fourth loop, "python hook", is the plain loop on a DDP model given PyTorch's own
Python all-reduce hook (``run.model(m, comm_hook="allreduce")``): what any Python comm hook
costs, the floor of a count that rides in DDP's all-reduce. And a sixth, "native sketch":
the design without a Python comm hook, written out by hand in its cheapest form (DDP's
built-in C++ all-reduce, which divides by the world size; the count all-reduced on its own,
issued before the forward so that it overlaps it; the loss multiplied by the count; the
gradients divided by ``count on all ranks / world size`` in one ``torch._foreach_div_``
before the step): the floor of that design, without any of the bookkeeping a library version
would add, to compare with what ``count=`` costs now.

A run switches to counted windows at its first ``count=`` and keeps them; to time a run
that never used ``count=`` beside one that does, the benchmark detaches the run's counted
state before each plain block and puts the same state back before each counted block
(``_Switch``: private attributes, the benchmark's business only). The plain loops' models
are made while it is detached, so their DDP keeps its built-in all-reduce.

Printed, per world size: each loop's median step and the median of per-round ratios of
block medians to "plain" with its 95% interval, for the wall time of a step (what the
issue's 1% is about) and for the training thread's CPU time in it (less noisy on a shared
machine: waiting for the other rank or for a core does not count).

    PYTHONPATH=src python benchmarks/count_bench.py [--workload W1] [--rounds 300]
        [--block 40] [--procs 1,2]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
import torch.nn.functional as F

from splitsync.testing import spawn

PLAIN, AA, COUNT, HOOK, NATIVE = ("plain", "plain again", "count=", "python hook",
                                  "native sketch")


class _Switch:
    """Detach and re-attach a run's counted state (see the module docstring)."""

    def __init__(self, run: Any) -> None:
        self.run, self.saved = run, None

    def set(self, counting: bool) -> None:
        plan, training = self.run._plan, self.run._training
        if counting and self.saved is not None:
            plan.counting = self.saved
        elif not counting and plan.counting is not None:
            self.saved, plan.counting = plan.counting, None
            training.backward_count = training._first_count
        else:
            return
        plan._choose()
        training.set_observers(self.run.observers)


def _allreduce_hook() -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.allreduce_hook


def _rank(rank: int, world: int, workload: str, rounds: int, block: int) -> dict[str, Any]:
    import splitsync
    from splitsync.bench.harness import interleave, summarize
    from splitsync.bench.registry import build_loop
    from splitsync.bench.workloads import make_workload

    torch.set_num_threads(1)
    with splitsync.init(seed=0) as run:
        ctx: dict[str, Any] = {"run": run, "device": run.device, "rank": run.rank,
                               "world_size": run.world_size, "seed": run.seed}
        wl = make_workload(workload)
        switch = _Switch(run)
        torch.manual_seed(0)
        counted = build_loop("splitsync", wl, wl.build(), ctx)
        x, y = next(counted._it)
        run.backward(F.cross_entropy(counted.model(x), y), count=len(y))  # arms the run
        run.step(counted.opt)
        switch.set(False)
        loops = {PLAIN: build_loop("splitsync", wl, wl.build(), ctx),
                 AA: build_loop("splitsync", wl, wl.build(), ctx), COUNT: counted}
        if run.world_size > 1:
            hooked = build_loop("splitsync", wl, wl.build(), ctx)
            hooked.model.register_comm_hook(None, _allreduce_hook())
            loops[HOOK] = hooked
            loops[NATIVE] = build_loop("splitsync", wl, wl.build(), ctx)
        cpu: dict[str, list[list[float]]] = {name: [] for name in loops}

        def variant(name: str):  # type: ignore[no-untyped-def]
            loop = loops[name]
            counting = name == COUNT
            native = name == NATIVE
            count = torch.zeros(1)

            def run_block(steps: int) -> list[float]:
                switch.set(counting)
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
                    if native:  # see the module docstring
                        import torch.distributed as dist

                        count.fill_(len(y))
                        work = dist.all_reduce(count, async_op=True)
                        loss = F.cross_entropy(loop.model(x), y) * len(y)
                        run.backward(loss)
                        work.wait()
                        grads = [p.grad for p in loop.model.parameters() if p.grad is not None]
                        torch._foreach_div_(grads, count.item() / run.world_size)
                        run.step(loop.opt)
                        used.append(thread() - c0)
                        wall.append(clock() - t0)
                        continue
                    loss = F.cross_entropy(loop.model(x), y)
                    if counting:
                        run.backward(loss, count=len(y))
                    else:
                        run.backward(loss)
                    run.step(loop.opt)
                    used.append(thread() - c0)
                    wall.append(clock() - t0)
                cpu[name].append(used)
                return wall

            return run_block

        blocks = interleave({n: variant(n) for n in loops}, rounds=rounds, block=block,
                            warmup=2)
        rows = [s.as_dict() for s in summarize(blocks, PLAIN)]
        cpu = {k: v[-rounds:] for k, v in cpu.items()}  # the warmup rounds left out
        cpu_rows = [s.as_dict() for s in summarize(cpu, PLAIN)]
        return {"rows": rows, "cpu_rows": cpu_rows, "batch": wl.batch_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--block", type=int, default=40)
    parser.add_argument("--procs", default="1,2")
    args = parser.parse_args()
    for world in (int(p) for p in args.procs.split(",")):
        t0 = time.perf_counter()
        out = spawn(_rank, world, args.workload, args.rounds, args.block, timeout=3600)[0]
        print(f"{args.workload}, {world} gloo rank(s), batch {out['batch']} per rank, "
              f"{args.rounds} rounds x {args.block} steps, {len(out['rows'])} loops interleaved "
              f"({time.perf_counter() - t0:.0f} s)")
        for title, rows in (("step time (wall)", out["rows"]),
                            ("training thread's CPU time a step", out["cpu_rows"])):
            print(f" {title}:")
            for r in rows:
                print(f"  {r['loop']:<12} median {r['median_ms']:.3f} ms  p90 "
                      f"{r['p90_ms']:.3f} ms  ratio {r['ratio']:.4f}x "
                      f"[{r['ratio_lo']:.4f}, {r['ratio_hi']:.4f}]")


if __name__ == "__main__":
    main()
