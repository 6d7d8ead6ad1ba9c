"""PNG plots of benchmark results (matplotlib, optional extra "bench" or "plot")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_plots", "have_matplotlib"]


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _overhead(plt: Any, res: dict, path: Path,
              title: str = "Per-step overhead, interleaved in one launch") -> None:
    labels, ratios, errs = [], [], []
    for o in res["overhead"]:
        for r in o["rows"]:
            if r.get("ratio") is None or r["loop"] == o.get("baseline"):
                continue  # the baseline is 1 by definition
            labels.append(f"{o['workload']} n={o['world_size']}\n{r.get('name', r['loop'])}")
            ratios.append(r["ratio"])
            errs.append((r["ratio"] - r["ratio_lo"], r["ratio_hi"] - r["ratio"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(labels)), 4))
    ax.bar(range(len(labels)), ratios, yerr=list(zip(*errs, strict=True)) if errs else None, capsize=3,
           color="#4c72b0")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("step time / baseline (95% CI)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _comm(plt: Any, res: dict, path: Path) -> None:
    rows = [c for c in res["comm"] if c.get("busbw_GBps")]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([c["bytes"] for c in rows], [c["busbw_GBps"] for c in rows], "o-",
            label="all-reduce bus bandwidth")
    ax.plot([c["bytes"] for c in rows], [c["memcpy_GBps"] for c in rows], "s--",
            label="memcpy (same machine)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title(f"All-reduce ({res['meta'].get('backend', '?')}) vs memcpy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _scaling(plt: Any, res: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    ns = sorted({s["n"] for s in res["scaling"]})
    ax.plot(ns, ns, ":", color="gray", label="ideal")
    for wl in sorted({s["workload"] for s in res["scaling"]}):
        rows = [s for s in res["scaling"] if s["workload"] == wl]
        one = next((s for s in rows if s["n"] == 1), None)
        if one is None:
            continue
        base = one["samples_per_s"]
        line = ax.plot([s["n"] for s in rows], [s["samples_per_s"] / base for s in rows], "o-",
                       label=f"{wl} measured")
        pred = [(s["n"], s["predicted_samples_per_s"] / base) for s in rows
                if s.get("predicted_samples_per_s")]
        if pred:
            ax.plot(*zip(*pred, strict=True), "x--", color=line[0].get_color(),
                    label=f"{wl} cost model")
    ax.set_xticks(ns)
    ax.set_xlabel("processes")
    ax.set_ylabel("speed-up in samples/s over 1 process")
    ax.set_title("Scaling: measured and predicted (fixed per-process batch)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(res: dict[str, Any], out: Path) -> list[Path]:
    """Write the PNGs the results allow; returns their paths (none without matplotlib)."""
    if not have_matplotlib():
        return []
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, fn, name in (("overhead", _overhead, "overhead.png"), ("naive", None, None),
                          ("comm", _comm, "allreduce.png"), ("scaling", _scaling, "scaling.png")):
        if fn is None or not res.get(key):
            continue
        fn(plt, res, out / name)
        written.append(out / name)
    if res.get("naive"):
        _overhead(plt, {"overhead": res["naive"]}, out / "naive_vs_ddp.png",
                  "DDP vs one all_reduce per parameter (ratio to DDP)")
        written.append(out / "naive_vs_ddp.png")
    return written
