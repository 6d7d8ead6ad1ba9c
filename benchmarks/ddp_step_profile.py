"""Where a 2-process DDP step's time goes: compute, waiting for the slower rank, all-reduce.

    python benchmarks/ddp_step_profile.py [--workload W1] [--steps 600] [--procs 2]

Each rank trains the workload with DDP (gloo on CPU) and, alternating in blocks of 50 steps,
without gradient sync. A DDP communication hook stamps the moment the bucket is ready (its
all-reduce starts) and the moment the all-reduce completes; ranks exchange their stamps
afterwards (one host, one monotonic clock), so each step splits into

- compute: forward + backward + optimizer, without the time spent inside the all-reduce;
- wait for the slower rank: from this rank's bucket being ready to the last rank's;
- all-reduce after the last arrival: from the last rank's bucket being ready to completion;
- resume: from completion to backward returning on this rank (waking the main thread).

Prints a markdown table of medians per rank (single-bucket models such as W1 and W2). Run it on an otherwise idle machine if you can.
"""


import argparse
import time
from typing import Any

import torch
import torch.distributed as dist


def _ms(x: float) -> str:
    return f"{1e3 * x:.3f}"


def _stamping_hook(stamps: list[list[float]]) -> Any:
    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        t0 = time.perf_counter()
        tensor = bucket.buffer().div_(dist.get_world_size())
        fut = dist.all_reduce(tensor, async_op=True).get_future()

        def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            stamps.append([t0, time.perf_counter()])
            return f.value()[0]
        return fut.then(done)
    return hook


def rank_fn(rank: int, world: int, workload: str, steps: int) -> list[dict] | None:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import splitsync
    from splitsync.bench.workloads import make_workload

    torch.set_num_threads(1)
    with splitsync.init(seed=0, guards=False):
        wl = make_workload(workload)
        torch.manual_seed(0)
        ddp = DDP(wl.build(), gradient_as_bucket_view=True)
        local = wl.build()
        stamps: list[list[float]] = []
        ddp.register_comm_hook(None, _stamping_hook(stamps))
        opts = {id(m): torch.optim.SGD(m.parameters(), lr=wl.lr, momentum=0.9)
                for m in (ddp, local)}
        loader = torch.utils.data.DataLoader(wl.dataset, batch_size=wl.batch_size)
        x, y = next(iter(loader))
        rows: dict[str, list[list[float]]] = {"ddp": [], "local": []}

        def step(model: torch.nn.Module, out: list[list[float]] | None) -> None:
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt = opts[id(model)]
            opt.step()
            opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            if out is not None:
                out.append([t0, t1, t2, t3])

        for _ in range(30):
            step(ddp, None)
            step(local, None)
        stamps.clear()
        for r in range(max(1, steps // 50)):
            for name in (("ddp", "local") if r % 2 == 0 else ("local", "ddp")):
                model = ddp if name == "ddp" else local
                for _ in range(50):
                    step(model, rows[name])
        if len(stamps) != len(rows["ddp"]):
            raise SystemExit(f"{workload}: {len(stamps)} buckets for {len(rows['ddp'])} steps; "
                             "this profile handles single-bucket models only.")
        mine = torch.tensor([a + b + [c[3] - c[0]] for a, b, c in
                             zip(rows["ddp"], stamps, rows["local"], strict=True)],
                            dtype=torch.float64)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        if rank != 0:
            return None
        last_ready = torch.stack([e[:, 4] for e in every]).max(0).values
        out = []
        for r, e in enumerate(every):
            t0, t1, t2, t3, ready, done = (e[:, k] for k in range(6))
            wait = (last_ready - ready)
            allreduce = (done - last_ready)
            resume = (t2 - done).clamp(min=0)
            compute = (t3 - t0) - wait - allreduce - resume
            # medians only: the result travels back through a pipe
            out.append({"rank": r, **{k: float(v.median()) for k, v in (
                ("ddp_step", t3 - t0), ("compute", compute), ("wait", wait),
                ("allreduce", allreduce), ("resume", resume), ("local_step", e[:, 6]))}})
        return out


def main() -> None:
    from splitsync.testing import spawn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="W1")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--procs", type=int, default=2)
    a = ap.parse_args()
    res = spawn(rank_fn, a.procs, a.workload, a.steps, timeout=300)[0]
    print(f"{a.workload}, {a.procs} gloo processes, medians in ms over {a.steps} steps\n")
    print("| rank | DDP step | compute | wait for slower rank | all-reduce after last arrival "
          "| resume | no-sync step |")
    print("|------|----------|---------|------|------|------|------|")
    for r in res:
        print(f"| {r['rank']} | {_ms(r['ddp_step'])} | {_ms(r['compute'])} | {_ms(r['wait'])} "
              f"| {_ms(r['allreduce'])} | {_ms(r['resume'])} | {_ms(r['local_step'])} |")


if __name__ == "__main__":  # spawned ranks re-import this file: keep the guard
    main()
