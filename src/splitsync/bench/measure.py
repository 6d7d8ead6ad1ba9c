"""What each rank runs: interleaved loop comparisons and the all-reduce sweep.

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

__all__ = ["measure_rank", "single_loop_rank", "comm_rank", "compare_loops", "comm_sweep",
           "comm_between_compute", "train_rounds", "OPTIONAL_LOOPS", "COMPUTE_GAP_S"]

OPTIONAL_LOOPS = ("accelerate", "fabric")
MIN_ROUNDS, MAX_ROUNDS = 6, 2000
# Compute before each all-reduce in the training-pattern sweep when no step time is known;
# otherwise the single-device step is used, as in training (on a loaded host the cost of
# waking the idle peer grows with the time it spent idle).
COMPUTE_GAP_S = 1e-3


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


def _busy(seconds: float, a: torch.Tensor, sync: Any) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(a, a)
        sync()  # on a GPU, do not queue more work than the gap holds


def train_rounds(gap_s: float, sizes: int, budget: float = 1.5) -> int:
    """Rounds of :func:`comm_between_compute` filling about ``budget`` seconds (20 to 100)."""
    return max(20, min(100, int(budget / (sizes * (gap_s + 1e-3)))))


def comm_between_compute(sizes: list[int], device: torch.device, rounds: int = 100,
                         gap_s: float = COMPUTE_GAP_S) -> list[dict]:
    """All-reduce time per size when every rank computes ``gap_s`` seconds before each call.

    This is the pattern of training: between two steps' all-reduces the ranks compute, the
    backend's threads go idle and the first rank to arrive waits for the others. Per call
    the time counted is that of the rank that arrived last (the smallest of the ranks' call
    times), so waiting for a slower rank is left out: that belongs to the per-device step.
    No clock is compared across processes. Each round visits every size (in rotating
    order), so a machine whose load drifts affects all sizes alike and the fit stays sane.
    """
    import torch.distributed as dist

    world = dist.get_world_size()
    a = torch.randn(64, 64, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    bufs = [torch.ones(max(1, nbytes // 4), device=device) for nbytes in sizes]
    own: list[list[float]] = [[] for _ in sizes]
    dist.barrier()
    for buf in bufs:
        dist.all_reduce(buf)
    for r in range(rounds):
        for k in range(len(sizes)):
            i = (k + r) % len(sizes)
            _busy(gap_s, a, sync)
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(bufs[i])
            sync()
            own[i].append(time.perf_counter() - t0)
    mine = torch.tensor(own, dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    last = torch.stack([t.cpu() for t in every]).min(0).values  # the last rank to arrive
    return [{"bytes": buf.numel() * 4, "allreduce_s": float(last[i].median()), "gap_s": gap_s,
             "own_median_s": median(own[i]), "rounds": rounds, "world_size": world}
            for i, buf in enumerate(bufs)]


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


def comm_rank(rank: int, world_size: int, sizes: list[int],
              gap_s: float = COMPUTE_GAP_S) -> list[dict] | None:
    """All-reduce between compute, alone (for ``splitsync plan --network measured``)."""
    import splitsync

    torch.set_num_threads(1)
    with splitsync.init(seed=0, guards=False) as run:
        rows = comm_between_compute(sizes, run.device, train_rounds(gap_s, len(sizes)), gap_s)
        return rows if rank == 0 else None
