"""What each rank runs: interleaved loop comparisons and the all-reduce sweep (the sweep
between compute is ``splitsync plan``'s, :mod:`splitsync.tools.plan.measure`).

``measure_rank`` is started on N processes by :func:`splitsync.launch.spawn.spawn` (or any
launcher); every rank runs the same schedule, and rank 0 returns the figures.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from splitsync.bench.harness import interleave, median, percentile, summarize
from splitsync.bench.registry import build_loop
from splitsync.bench.workloads import make_workload
from splitsync.tools.plan.measure import COMPUTE_GAP_S, comm_between_compute, train_rounds

__all__ = ["measure_rank", "single_loop_rank", "compare_loops", "comm_sweep", "OPTIONAL_LOOPS"]

OPTIONAL_LOOPS = ("accelerate", "fabric")
MIN_ROUNDS, MAX_ROUNDS = 6, 2000


def _has_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _schedule(loops: dict[str, Any], ctx: dict[str, Any], budget: float,
              block_s: float) -> tuple[int, Any]:
    """(block, more) filling ``budget`` seconds with blocks of about ``block_s`` seconds.

    Rank 0 decides (block size from a warm-up; whether to run another round from its clock)
    and broadcasts, so every rank runs the same schedule.
    """
    run = ctx["run"]
    warm = [t for loop in loops.values() for t in loop.run(20)[5:]]
    step = run.broadcast(median(warm))
    block = max(3, min(200, round(block_s / step)))
    deadline = time.monotonic() + budget
    return block, lambda done: bool(run.broadcast(time.monotonic() < deadline))


def compare_loops(wl_name: str, kinds: list[str], baseline: str, ctx: dict[str, Any], *,
                  budget: float = 5.0, block_s: float = 0.02, rounds: int | None = None,
                  block: int | None = None, warmup: int = 2,
                  optional: tuple[str, ...] = ()) -> dict:
    """Interleave the loops ``kinds`` (+ ``optional`` ones when importable) on a workload.

    Without explicit ``rounds``/``block`` the schedule fills about ``budget`` seconds.
    """
    wl = make_workload(wl_name)
    torch.manual_seed(ctx["seed"])
    base = wl.build()
    loops, missing = {}, {}
    for kind in [*kinds, *optional]:
        try:
            loops[kind] = build_loop(kind, wl, base, ctx)
        except ImportError as exc:
            missing[kind] = f"not installed ({exc.name or exc})"
        except Exception as exc:  # an optional framework that cannot run here
            if kind not in optional:
                raise
            missing[kind] = f"failed: {type(exc).__name__}: {exc}"[:200]
    more, max_rounds = None, None
    if rounds is None or block is None:
        block, more = _schedule(loops, ctx, budget, block_s)
        rounds, max_rounds = MIN_ROUNDS, MAX_ROUNDS
    blocks = interleave({k: loop.run for k, loop in loops.items()}, rounds=rounds, block=block,
                        warmup=warmup, max_rounds=max_rounds, more=more)
    rows = [s.as_dict() for s in summarize(blocks, baseline)]
    q = 100 * 0.5 ** (1 / ctx["world_size"])  # median of the slowest of N independent ranks
    for row in rows:
        row["slowest_of_n_ms"] = 1e3 * percentile([t for b in blocks[str(row["loop"])] for t in b], q)
    ref = loops[baseline].params()
    for row in rows:
        kind = str(row["loop"])
        row["name"] = loops[kind].name
        # Loops fed by the same sampler order must end with identical parameters.
        same_data = kind in ("splitsync", "hand", "bare", "naive", "ddp1")
        row["max_param_diff"] = _max_diff(loops[kind].params(), ref) if same_data else None
    for kind, why in missing.items():
        rows.append({"loop": kind, "name": kind, "note": why})
    return {"workload": wl_name, "title": wl.title, "world_size": ctx["world_size"],
            "baseline": baseline, "rounds": rounds, "block": block, "rows": rows}


def _reps(nbytes: int, budget: float) -> int:
    # Fixed on every rank (no timing-based decision that could differ between ranks).
    return max(3, min(200, int(budget * 2e8 / max(nbytes, 8192))))


def comm_sweep(sizes: list[int], device: torch.device, budget: float) -> list[dict]:
    """All-reduce (sum) time per message size, interleaved with a same-size memcpy."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    out = []
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        buf = torch.ones(numel, device=device)
        src, dst = torch.ones(numel, device=device), torch.empty(numel, device=device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        ar, cp = [], []
        if world > 1:
            dist.barrier()
            dist.all_reduce(buf)
        for _ in range(_reps(nbytes, budget)):
            t0 = time.perf_counter()
            if world > 1:
                dist.all_reduce(buf)
            sync()
            t1 = time.perf_counter()
            dst.copy_(src)
            sync()
            t2 = time.perf_counter()
            ar.append(t1 - t0)
            cp.append(t2 - t1)
        size = numel * 4
        t_ar, t_cp = median(ar), median(cp)
        busbw = size / t_ar * (2 * (world - 1) / world) if world > 1 else None
        out.append({"bytes": size, "allreduce_s": t_ar, "algbw_GBps": size / t_ar / 1e9,
                    "busbw_GBps": None if busbw is None else busbw / 1e9,
                    "memcpy_s": t_cp, "memcpy_GBps": size / t_cp / 1e9, "world_size": world})
    return out


def measure_rank(rank: int, world_size: int, spec: dict[str, Any]) -> dict | None:
    """Run ``spec`` on this rank: overhead comparisons, naive-vs-DDP, all-reduce sweep."""
    import splitsync

    torch.set_num_threads(1)
    # The user's defaults (guards on) unless the spec says otherwise.
    with splitsync.init(seed=spec.get("seed", 0), guards=spec.get("guards", True)) as run:
        ctx = {"run": run, "device": run.device, "rank": run.rank,
               "world_size": run.world_size, "seed": run.seed}
        res: dict[str, Any] = {"world_size": run.world_size, "device": str(run.device),
                               "backend": run.backend, "overhead": [], "naive": []}
        baseline = "hand" if world_size > 1 else "bare"
        optional = OPTIONAL_LOOPS if spec.get("optional", True) else ()
        # At N > 1 the unsynchronised loop gives the per-device compute time under the same
        # load, which the cost model's validation needs.
        kinds = [baseline, "splitsync"] + (["local"] if world_size > 1 else [])
        # At 1 process, DDP on a 1-process group gives DDP's own per-step cost (no peer).
        if world_size == 1 and spec.get("ddp_overhead") and _has_group():
            kinds.append("ddp1")
        for wl in spec.get("workloads", ["W1", "W2"]):
            res["overhead"].append(compare_loops(
                wl, kinds, baseline, ctx, budget=spec.get("budget", 5.0),
                rounds=spec.get("rounds"), block=spec.get("block"), optional=optional))
        if world_size > 1:
            for wl in spec.get("naive_workloads", []):
                res["naive"].append(compare_loops(
                    wl, ["hand", "naive"], "hand", ctx, budget=spec.get("naive_budget", 3.0),
                    rounds=spec.get("rounds"), block=spec.get("block"), warmup=1))
        if spec.get("comm_sizes"):
            res["comm"] = comm_sweep(spec["comm_sizes"], run.device, spec.get("comm_budget", 0.05))
        if spec.get("train_comm_sizes") and world_size > 1:
            res["comm_train"] = []
            # One sweep per workload, with the workload's own compute between all-reduces.
            for wl, gap in (spec.get("train_comm_gaps") or {None: COMPUTE_GAP_S}).items():
                rows = comm_between_compute(spec["train_comm_sizes"], run.device,
                                            train_rounds(gap, len(spec["train_comm_sizes"])), gap)
                res["comm_train"] += [{**r, "workload": wl} for r in rows]
        return res if rank == 0 else None


def single_loop_rank(rank: int, world_size: int, spec: dict[str, Any]) -> dict | None:
    """One loop alone (a separate launch): median step time of ``spec['loop']``."""
    import splitsync

    torch.set_num_threads(1)
    with splitsync.init(seed=spec.get("seed", 0), guards=spec.get("guards", True)) as run:
        ctx = {"run": run, "device": run.device, "rank": run.rank,
               "world_size": run.world_size, "seed": run.seed}
        wl = make_workload(spec["workload"])
        torch.manual_seed(run.seed)
        loop = build_loop(spec["loop"], wl, wl.build(), ctx)
        loop.run(spec["block"])  # warm-up
        times = loop.run(spec["steps"])
        return {"median_s": median(times), "steps": len(times)} if rank == 0 else None
