"""The standard benchmark set behind ``splitsync bench``: measure, compare, predict, report."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from splitsync.bench.harness import median
from splitsync.tools.plan import costmodel

__all__ = ["BenchOptions", "run_suite", "SECTIONS", "plan_validation", "scaling_rows"]

SECTIONS = ("overhead", "naive", "dp", "comm", "import", "launch", "separate", "scaling")
QUICK_SECTIONS = ("overhead", "naive", "comm", "scaling")
COMM_SIZES = tuple(1024 * 4**k for k in range(10))  # 1 KiB .. 256 MiB, cut at 64 MiB below
QUICK_COMM_SIZES = (1024, 64 * 1024, 1024**2, 16 * 1024**2)


@dataclass(frozen=True)
class BenchOptions:
    """What to measure and how long; ``rounds``/``block`` fix the schedule (tests)."""

    quick: bool = False
    sections: tuple[str, ...] = SECTIONS
    procs: tuple[int, ...] = (1, 2)
    workloads: tuple[str, ...] = ("W1", "W2")
    budget: float = 10.0  # seconds per interleaved comparison
    rounds: int | None = None
    block: int | None = None
    comm_sizes: tuple[int, ...] = tuple(s for s in COMM_SIZES if s <= 64 * 1024**2)
    pairs: int = 5  # alternations for whole-process timings
    seed: int = 0
    optional: bool = True  # try accelerate / lightning fabric
    guards: bool = True  # splitsync's default; False measures the loop without guards
    timeout: float = 900.0
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def quick_defaults() -> BenchOptions:
        return BenchOptions(quick=True, sections=QUICK_SECTIONS, budget=4.0,
                            comm_sizes=QUICK_COMM_SIZES, pairs=2)


def _spec(opts: BenchOptions, world: int, gaps: dict[str, float] | None = None) -> dict[str, Any]:
    naive = [w for w in opts.workloads if "naive" in opts.sections]
    return {"seed": opts.seed, "budget": opts.budget,
            "workloads": list(opts.workloads) if "overhead" in opts.sections else [],
            "rounds": opts.rounds, "block": opts.block, "optional": opts.optional,
            "guards": opts.guards,
            "naive_workloads": naive[:1] if opts.quick else naive,
            "naive_budget": opts.budget * 0.6,
            "comm_sizes": list(opts.comm_sizes) if "comm" in opts.sections and world > 1 else [],
            "train_comm_sizes": (list(costmodel.TRAIN_COMM_SIZES) if world > 1 and
                                 {"comm", "scaling"} & set(opts.sections) else []),
            "train_comm_gaps": gaps or {},
            "ddp_overhead": "scaling" in opts.sections or "comm" in opts.sections,
            "comm_budget": 0.02 if opts.quick else 0.1}


def _params(workload: str) -> int:
    from splitsync.bench.workloads import make_workload

    return sum(p.numel() for p in make_workload(workload).build().parameters())


def _fit(rows: Sequence[dict]) -> costmodel.Network | None:
    multi = [c for c in rows if c.get("world_size", 1) > 1]
    if len(multi) < 2:
        return None
    return costmodel.fit_network([c["bytes"] for c in multi], [c["allreduce_s"] for c in multi],
                                 multi[0]["world_size"])


def plan_validation(overhead: Sequence[dict], comm: Sequence[dict],
                    comm_train: Sequence[dict] = ()) -> list[dict]:
    """Predict the 2-process step of each workload from per-device steps and measured comm.

    The network is fitted to the all-reduces timed between compute (``comm_train``, the
    pattern of training) when they were measured, else to the back-to-back sweep; the
    back-to-back fit is kept as a contrast (``_b2b`` keys).
    """
    b2b = _fit(comm)
    fits = {wl: _fit([c for c in comm_train if c.get("workload") == wl])
            for wl in {c.get("workload") for c in comm_train}}
    if b2b is None and not any(fits.values()):
        return []

    def loop_s(o: dict, loop: str) -> float | None:
        return next((r["median_ms"] / 1e3 for r in o["rows"]
                     if r["loop"] == loop and r.get("median_ms") is not None), None)

    def slowest_s(o: dict, loop: str) -> float | None:
        return next((r["slowest_of_n_ms"] / 1e3 for r in o["rows"]
                     if r["loop"] == loop and r.get("slowest_of_n_ms") is not None), None)

    step1 = {o["workload"]: loop_s(o, "splitsync") for o in overhead if o["world_size"] == 1}
    # DDP's own per-step work: DDP on a 1-process group minus the bare step, interleaved.
    sync_o = {o["workload"]: max(0.0, (loop_s(o, "ddp1") or 0.0) - (loop_s(o, "bare") or 0.0))
              for o in overhead if o["world_size"] == 1 and loop_s(o, "ddp1") is not None}
    rows = []
    for o in overhead:
        wl, n = o["workload"], o["world_size"]
        measured, local = loop_s(o, "splitsync"), loop_s(o, "local")
        if n == 1 or measured is None:
            continue
        grad = 4 * _params(wl)
        train = fits.get(wl) or fits.get(None)
        net = train or b2b
        if net is None:
            continue
        row: dict[str, Any] = {
            "workload": wl, "n": n, "measured_ms": 1e3 * measured, "grad_bytes": grad,
            "fit_bandwidth_GBps": net.bandwidth / 1e9, "fit_latency_us": net.latency * 1e6,
            "network_pattern": "between compute" if train else "back to back",
            "compute_gap_ms": next((1e3 * c["gap_s"] for c in comm_train
                                    if c.get("workload") in (wl, None) and "gap_s" in c), None)}
        slow, one = slowest_s(o, "local"), step1.get(wl)
        # The same straggler prediction written as plan's inputs: 1-process step x c.
        row["compute_scale"] = None if slow is None or not one else slow / one
        if b2b is not None:
            row["b2b_bandwidth_GBps"], row["b2b_latency_us"] = b2b.bandwidth / 1e9, b2b.latency * 1e6
        # Calibrations of the per-device step: the unsynchronised step at the same load (the
        # per-device compute time, as on separate GPUs), a separate 1-process launch, and
        # "_straggler": a synchronised step waits for the slowest rank, so its compute time
        # is the median of the slowest of N ranks' unsynchronised steps. "_b2b": the
        # straggler step with the network fitted to back-to-back all-reduces.
        # "_no_ddp_overhead": the straggler step without the measured DDP overhead term.
        ov = sync_o.get(wl, 0.0)
        row["ddp_overhead_ms"] = 1e3 * ov if wl in sync_o else None
        cases = [("", local, net, ov), ("_from_1proc", step1.get(wl), net, ov),
                 ("_straggler", slowest_s(o, "local"), net, ov),
                 ("_no_ddp_overhead", slowest_s(o, "local"), net, 0.0)]
        if b2b is not None and train is not None:
            cases.append(("_b2b", slowest_s(o, "local"), b2b, ov))
        for tag, t1, nw, o_s in cases:
            row[f"single_step{tag}_ms"] = None if t1 is None else 1e3 * t1
            for overlap, key in ((True, "predicted"), (False, "predicted_no_overlap")):
                p = None if t1 is None else costmodel.predict(t1, grad, n, nw, overlap=overlap,
                                                              sync_overhead=o_s)
                row[f"{key}{tag}_ms"] = None if p is None else 1e3 * p.step_time
            pred = row[f"predicted{tag}_ms"]
            row[f"error{tag}"] = None if pred is None else pred / row["measured_ms"] - 1
        rows.append(row)
    return rows


def scaling_rows(overhead: Sequence[dict], validation: Sequence[dict]) -> list[dict]:
    """Throughput and parallel efficiency per workload and process count (weak scaling)."""
    from splitsync.bench.workloads import make_workload

    pred = {(v["workload"], v["n"]): v["predicted_ms"] for v in validation
            if v.get("predicted_ms") is not None}
    rows = []
    for o in sorted(overhead, key=lambda o: (o["workload"], o["world_size"])):
        wl, n = o["workload"], o["world_size"]
        ms = next(r["median_ms"] for r in o["rows"] if r["loop"] == "splitsync")
        one = next((x for x in overhead if x["workload"] == wl and x["world_size"] == 1), None)
        bs = make_workload(wl).batch_size
        row = {"workload": wl, "n": n, "step_ms": ms, "samples_per_s": n * bs / ms * 1e3}
        if one is not None:
            ms1 = next(r["median_ms"] for r in one["rows"] if r["loop"] == "splitsync")
            row["efficiency"] = ms1 / ms
            p = pred.get((wl, n), ms1 if n == 1 else None)
            row["predicted_samples_per_s"] = None if p is None else n * bs / p * 1e3
            row["predicted_efficiency"] = None if p is None else ms1 / p
        rows.append(row)
    return rows


def _meta(opts: BenchOptions) -> dict[str, Any]:
    import torch

    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "options": {k: v for k, v in asdict(opts).items() if k != "extra"}}


def run_suite(opts: BenchOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the chosen sections; return the results (what results.json holds)."""
    from splitsync.bench.measure import measure_rank, single_loop_rank
    from splitsync.launch.spawn import spawn

    res: dict[str, Any] = {"meta": _meta(opts), "overhead": [], "naive": [], "comm": [],
                           "comm_train": []}
    if {"overhead", "naive", "comm"} & set(opts.sections):
        for n in opts.procs:
            echo(f"measuring {', '.join(opts.workloads)} at {n} process(es) ...")
            # The 1-process steps set the compute between the training-pattern all-reduces.
            gaps = {o["workload"]: r["median_ms"] / 1e3 for o in res["overhead"]
                    if o["world_size"] == 1 for r in o["rows"]
                    if r["loop"] == "splitsync" and (r.get("median_ms") or 0) > 0}
            out = spawn(measure_rank, n, _spec(opts, n, gaps), timeout=opts.timeout)[0]
            res["overhead"] += out["overhead"]
            res["naive"] += out["naive"]
            res["comm"] += out.get("comm", [])
            res["comm_train"] += out.get("comm_train", [])
            res["meta"]["device"], res["meta"]["backend"] = out["device"], out["backend"]
    res["plan_validation"] = plan_validation(res["overhead"], res["comm"], res["comm_train"])
    if "scaling" in opts.sections:
        res["scaling"] = scaling_rows(res["overhead"], res["plan_validation"])
    if "separate" in opts.sections and max(opts.procs) > 1:
        echo("timing separate launches ...")
        res["separate"] = _separate(opts, spawn, single_loop_rank)
    if "dp" in opts.sections:
        echo("DataParallel vs DDP ...")
        res["dp"] = dp_vs_ddp(opts, spawn, single_loop_rank)
    if "import" in opts.sections:
        from splitsync.bench.startup import import_times

        echo("timing imports ...")
        res["import"] = import_times(opts.pairs)
    if "launch" in opts.sections:
        from splitsync.bench.startup import launch_times

        echo("timing launches ...")
        res["launch"] = launch_times(max(opts.procs), max(1, opts.pairs // 2))
    return res


def _separate(opts: BenchOptions, spawn: Any, fn: Any) -> list[dict]:
    """Each loop in its own launch, alternating A B A B (drift is not cancelled here)."""
    n = max(opts.procs)
    times: dict[str, list[float]] = {"hand": [], "splitsync": []}
    for i in range(max(2, opts.pairs // 2)):
        for loop in (["hand", "splitsync"] if i % 2 == 0 else ["splitsync", "hand"]):
            spec = {"seed": opts.seed, "workload": opts.workloads[0], "loop": loop,
                    "block": 50, "steps": 400, "guards": opts.guards}
            times[loop].append(spawn(fn, n, spec, timeout=opts.timeout)[0]["median_s"])
    ratios = [a / b for a, b in zip(times["splitsync"], times["hand"], strict=True)]
    return [{"workload": opts.workloads[0], "world_size": n, "loop": k,
             "median_ms": 1e3 * median(v), "launches": len(v),
             "ratio": 1.0 if k == "hand" else median(ratios),
             "ratio_min": None if k == "hand" else min(ratios),
             "ratio_max": None if k == "hand" else max(ratios)} for k, v in times.items()]


def dp_vs_ddp(opts: BenchOptions, spawn: Any, fn: Any) -> list[dict]:
    """One process with nn.DataParallel over all GPUs vs one DDP process per GPU."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        return [{"note": f"n/a: needs 2 or more GPUs ({n} visible)"}]
    rows = []
    for wl in opts.workloads:
        times: dict[str, list[float]] = {"dp": [], "hand": []}
        for i in range(max(2, opts.pairs // 2)):
            for loop in (["dp", "hand"] if i % 2 == 0 else ["hand", "dp"]):
                spec = {"seed": opts.seed, "workload": wl, "loop": loop, "block": 50,
                        "steps": 300}
                world = 1 if loop == "dp" else n
                times[loop].append(spawn(fn, world, spec, timeout=opts.timeout)[0]["median_s"])
        ratios = [a / b for a, b in zip(times["dp"], times["hand"], strict=True)]
        rows.append({"workload": wl, "gpus": n, "dp_step_ms": 1e3 * median(times["dp"]),
                     "ddp_step_ms": 1e3 * median(times["hand"]), "dp_over_ddp": median(ratios),
                     "launches": len(ratios)})
    return rows


def write_results(res: dict[str, Any], out: Path) -> Path:
    """Write ``results.json`` into ``out``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(res, indent=2, default=str) + "\n")
    return path
