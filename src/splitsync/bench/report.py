"""Markdown tables of benchmark results, as printed by ``splitsync bench``."""

from __future__ import annotations

from typing import Any

from splitsync.bench.harness import markdown_table

__all__ = ["render", "overhead_table"]


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _ratio(row: dict) -> str:
    if row.get("ratio") is None:
        return "n/a"
    ci = ""
    if row.get("ratio_lo") is not None and row["loop"] not in ("hand", "bare"):
        ci = f" [{row['ratio_lo']:.3f}, {row['ratio_hi']:.3f}]"
    return f"{row['ratio']:.3f}x{ci}"


def overhead_table(blocks: list[dict], title: str = "Step time, side by side") -> str:
    """One row per loop, workload and process count; ratio to the baseline of its run."""
    rows = []
    for o in blocks:
        for r in o["rows"]:
            same = r.get("max_param_diff")
            rows.append([
                o["workload"], o["world_size"], r.get("name", r["loop"]),
                _f(r.get("median_ms")), _f(r.get("p90_ms")), _ratio(r),
                r.get("rounds", ""),
                "n/a" if same is None else ("yes" if same == 0 else f"diff {same:.1e}"),
                r.get("note", ""),
            ])
    head = ["workload", "procs", "loop", "median ms", "p90 ms",
            "ratio to baseline [95% CI]", "rounds", "identical params", "note"]
    return f"### {title}\n\n" + markdown_table(head, rows)


def _comm(rows: list[dict]) -> str:
    body = [[_size(c["bytes"]), c["world_size"], _f(1e6 * c["allreduce_s"], "{:.1f}"),
             _f(c["algbw_GBps"]), _f(c["busbw_GBps"]), _f(c["memcpy_GBps"]),
             _f(c["busbw_GBps"] / c["memcpy_GBps"] if c["busbw_GBps"] else None)] for c in rows]
    head = ["size", "procs", "all-reduce us", "algbw GB/s", "busbw GB/s", "memcpy GB/s",
            "busbw / memcpy"]
    return "### All-reduce bandwidth vs memcpy\n\n" + markdown_table(head, body)


def _size(b: int) -> str:
    for unit, k in (("MiB", 1024**2), ("KiB", 1024)):
        if b >= k:
            return f"{b / k:g} {unit}"
    return f"{b} B"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _validation(rows: list[dict]) -> str:
    body = [[v["workload"], v["n"], _f(v["measured_ms"]),
             _f(v["single_step_straggler_ms"]), _f(v.get("compute_scale")),
             _f(v.get("ddp_overhead_ms")), _f(v["predicted_straggler_ms"]),
             _pct(v["error_straggler"]), _pct(v.get("error_no_ddp_overhead")),
             _pct(v.get("error_b2b")),
             _f(v["single_step_ms"]), _pct(v["error"]),
             _f(v["single_step_from_1proc_ms"]), _pct(v["error_from_1proc"]),
             _f(v["fit_bandwidth_GBps"]), _f(v["fit_latency_us"], "{:.1f}")] for v in rows]
    head = ["workload", "procs", "measured ms",
            "slowest-rank compute ms", "c", "DDP overhead ms", "plan ms", "error",
            "error without DDP overhead", "error, back-to-back fit",
            "compute ms", "error", "1-proc launch ms", "error",
            "fitted GB/s", "fitted latency us"]
    return ("### `splitsync plan` calibrated here vs measured\n\n" + markdown_table(head, body)
            + "\n\nPer-device step calibrations: slowest-rank compute = the median of the "
            "slowest of N ranks training without gradient sync, interleaved with the measured "
            "loops (a synchronised step waits for that rank); compute = the median of every "
            "such rank; 1-proc launch = the step of the one-process run; c = slowest-rank "
            "compute over the 1-process step (plan's --compute-scale); DDP overhead = DDP on a "
            "1-process group minus the bare step (plan's --ddp-overhead-ms). The all-reduce "
            "latency and bandwidth are fitted to all-reduces timed between stretches of "
            "compute as long as the 1-process step, as in training; 'back-to-back fit' uses "
            "the sweep above instead.")


def _scaling(rows: list[dict]) -> str:
    body = [[s["workload"], s["n"], _f(s["step_ms"]), _f(s["samples_per_s"], "{:.0f}"),
             _f(s.get("efficiency")), _f(s.get("predicted_samples_per_s"), "{:.0f}"),
             _f(s.get("predicted_efficiency"))] for s in rows]
    head = ["workload", "procs", "step ms", "samples/s", "efficiency", "predicted samples/s",
            "predicted efficiency"]
    return "### Scaling (fixed per-process batch)\n\n" + markdown_table(head, body)


def _timing(rows: list[dict], title: str) -> str:
    body = [[r["what"], _f(r.get("median_s")), _f(r.get("ratio"), "{:.3f}x"), r.get("runs", ""),
             r.get("note", "")] for r in rows]
    return f"### {title}\n\n" + markdown_table(["what", "median s", "ratio", "runs", "note"], body)


def _separate(rows: list[dict]) -> str:
    body = [[r["workload"], r["world_size"], r["loop"], _f(r["median_ms"]), _f(r["ratio"]),
             f"{_f(r['ratio_min'])} .. {_f(r['ratio_max'])}", r["launches"]] for r in rows]
    head = ["workload", "procs", "loop", "median ms", "ratio", "range over pairs", "launches"]
    return "### Separate launches (for contrast: drift not cancelled)\n\n" + markdown_table(head, body)


def _dp(rows: list[dict]) -> str:
    if "note" in rows[0]:
        return "### DataParallel vs DDP\n\n" + rows[0]["note"]
    body = [[r["workload"], r["gpus"], _f(r["dp_step_ms"]), _f(r["ddp_step_ms"]),
             _f(r["dp_over_ddp"], "{:.3f}x"), r["launches"]] for r in rows]
    head = ["workload", "GPUs", "DataParallel step ms", "DDP step ms", "DP / DDP", "pairs"]
    return "### DataParallel vs DDP (same samples per step)\n\n" + markdown_table(head, body)


def render(res: dict[str, Any]) -> str:
    """All tables present in ``res``, as one markdown document."""
    parts = []
    if res.get("overhead"):
        guards = res.get("meta", {}).get("options", {}).get("guards", True)
        parts.append(overhead_table(
            res["overhead"], "Overhead: step time, side by side in one launch "
            f"(splitsync with guards {'on, the default' if guards else 'off'})"))
    if res.get("naive"):
        parts.append(overhead_table(res["naive"], "DDP vs one all_reduce per parameter"))
    if res.get("dp"):
        parts.append(_dp(res["dp"]))
    if res.get("comm"):
        parts.append(_comm(res["comm"]))
    if res.get("plan_validation"):
        parts.append(_validation(res["plan_validation"]))
    if res.get("scaling"):
        parts.append(_scaling(res["scaling"]))
    if res.get("separate"):
        parts.append(_separate(res["separate"]))
    if res.get("import"):
        parts.append(_timing(res["import"], "Import time (fresh interpreter)"))
    if res.get("launch"):
        parts.append(_timing(res["launch"], "Launch to end of first step"))
    return "\n\n".join(parts) + "\n"
