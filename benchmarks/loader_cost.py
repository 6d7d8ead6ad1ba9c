"""What ``run.loader`` costs per batch against a DataLoader with a DistributedSampler.

    python benchmarks/loader_cost.py [--procs 1,2] [--rounds 60] [--block 16] [--workers 0,2]
        [--datasets tensor,python] [--n 2048] [--dim 32] [--batch 32] [--ledger]
    splitsync run -n 2 benchmarks/loader_cost.py ...    # the same, ranks made by the launcher

Both loaders read the same map-style dataset with the same batch size, shuffled, in the same
processes: ``run.loader(ds, batch, shuffle=True)`` and
``DataLoader(ds, batch, sampler=DistributedSampler(ds, W, rank, shuffle=True, seed=0))``
with ``set_epoch`` every epoch. Blocks of ``--block`` whole epochs alternate (A B, then
B A, ...); a block is timed from its first ``set_epoch`` to its last batch (creating each
epoch's iterator included, as a training loop pays it) and divided by its batches, so a
cost paid once every few epochs counts in full, not only in the epochs that pay it. Ranks
start each block together (a barrier, outside the timing). Per case, rank 0
prints each loader's median µs per batch, the ratio of the medians, and the median of the
per-pair differences (splitsync minus DataLoader) with a distribution-free 95% interval,
for the wall clock and for the main thread's CPU time (``time.thread_time``: on a shared
machine far less noisy, and it holds all of the sampler's and loader's own work; with
workers the fetching itself is in the workers, not in it).
With workers both loaders keep them (``persistent_workers=True``), so a pass does not time
worker start-up. ``--ledger`` makes the run with ``init(ledger=True)``.

Only the public API and torch. At one process it runs in this process; at more, ranks are
started with ``splitsync.testing.spawn`` (gloo, one thread each), unless the script is
already running under a launcher.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset


class Rows(Dataset):
    """A plain Python map-style dataset: one row and its label per ``__getitem__``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _dataset(kind: str, n: int, dim: int) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, dim, generator=g), torch.randint(0, 10, (n,), generator=g)
    if kind == "tensor":
        return TensorDataset(x, y)
    if kind == "python":
        return Rows(x, y)
    raise ValueError(f"--datasets: unknown kind {kind!r}; choose tensor or python.")


def _passes_us(loader: Any, epochs: range, set_epoch: Any) -> tuple[float, float]:
    """Whole passes over ``epochs``: (wall, this thread's CPU) microseconds per batch."""
    t0, c0 = time.perf_counter(), time.thread_time()
    n = 0
    for epoch in epochs:
        set_epoch(epoch)
        for _ in loader:
            n += 1
    c1, t1 = time.thread_time(), time.perf_counter()
    n = max(n, 1)
    return (t1 - t0) * 1e6 / n, (c1 - c0) * 1e6 / n


def _ci(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95% interval for the median (order statistics)."""
    v, n = sorted(values), len(values)
    if n < 6:
        return v[0], v[-1]
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(int(n / 2 - half), 0), min(int(math.ceil(n / 2 + half)), n - 1)
    return v[lo], v[hi]


def _case(run: Any, kind: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    ds = _dataset(kind, args.n, args.dim)
    extra: dict[str, Any] = {"persistent_workers": True} if workers else {}
    ours = run.loader(ds, args.batch, shuffle=True, num_workers=workers, **extra)
    sampler = DistributedSampler(ds, num_replicas=run.world_size, rank=run.rank,
                                 shuffle=True, seed=0)
    plain = DataLoader(ds, batch_size=args.batch, sampler=sampler, num_workers=workers,
                       **extra)
    a: list[tuple[float, float]] = []
    b: list[tuple[float, float]] = []
    warm = range(args.warmup)  # warm both (and start their workers)
    _passes_us(ours, warm, ours.set_epoch)
    _passes_us(plain, warm, sampler.set_epoch)
    for i in range(args.rounds):
        epochs = range(args.warmup + i * args.block, args.warmup + (i + 1) * args.block)
        for which in ((0, 1) if i % 2 == 0 else (1, 0)):
            run.barrier()
            if which == 0:
                a.append(_passes_us(ours, epochs, ours.set_epoch))
            else:
                b.append(_passes_us(plain, epochs, sampler.set_epoch))
    del ours, plain  # their workers end here
    row: dict[str, Any] = {"dataset": kind, "workers": workers, "procs": run.world_size,
                           "rounds": args.rounds}
    for i, clock in enumerate(("wall", "cpu")):
        xa, xb = [x[i] for x in a], [x[i] for x in b]
        diff = [x - y for x, y in zip(xa, xb, strict=True)]
        ma, mb = statistics.median(xa), statistics.median(xb)
        row[clock] = {"ours_us": ma, "plain_us": mb, "ratio": ma / mb,
                      "diff_us": statistics.median(diff), "diff_ci": _ci(diff)}
    return row


def _rank(rank: int, world: int, args: argparse.Namespace, run_dir: str) -> list[dict[str, Any]]:
    import splitsync

    torch.set_num_threads(1)
    out = []
    with splitsync.init(seed=0, ledger=args.ledger, run_dir=run_dir) as run:
        for kind in args.datasets.split(","):
            for workers in (int(w) for w in args.workers.split(",")):
                out.append(_case(run, kind, workers, args))
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| procs | dataset | workers | clock | run.loader µs/batch | "
             "DataLoader+DS µs/batch | ratio | diff µs/batch [95% CI] | rounds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for clock in ("wall", "cpu"):
            c = r[clock]
            lo, hi = c["diff_ci"]
            lines.append(f"| {r['procs']} | {r['dataset']} | {r['workers']} | {clock} | "
                         f"{c['ours_us']:.1f} | {c['plain_us']:.1f} | {c['ratio']:.3f} | "
                         f"{c['diff_us']:+.1f} [{lo:+.1f}, {hi:+.1f}] | {r['rounds']} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", default="1,2", help="process counts, comma-separated")
    p.add_argument("--rounds", type=int, default=60, help="alternating pairs of blocks")
    p.add_argument("--block", type=int, default=16,
                   help="epochs per timed block (whole blocks: a cost paid once every few "
                        "epochs counts in full)")
    p.add_argument("--warmup", type=int, default=4, help="untimed epochs first")
    p.add_argument("--workers", default="0,2", help="num_workers values, comma-separated")
    p.add_argument("--datasets", default="tensor,python", help="tensor and/or python")
    p.add_argument("--n", type=int, default=2048, help="samples in the dataset")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=32, help="per-process batch size")
    p.add_argument("--ledger", action="store_true", help="init(ledger=True)")
    args = p.parse_args()
    run_dir = tempfile.mkdtemp(prefix="loader-cost-")
    if "WORLD_SIZE" in os.environ:  # under a launcher: this process is one rank
        rows = _rank(int(os.environ.get("RANK", 0)), int(os.environ["WORLD_SIZE"]), args,
                     run_dir)
        if int(os.environ.get("RANK", 0)) == 0:
            print(_table(rows), flush=True)
        return
    from splitsync.testing import spawn

    rows = []
    load = f"{os.getloadavg()[0]:.1f}"
    for procs in (int(x) for x in args.procs.split(",")):
        if procs == 1:
            rows += _rank(0, 1, args, run_dir)
        else:
            rows += spawn(_rank, procs, args, run_dir, timeout=3600)[0]
    print(f"load average before/after: {load} / {os.getloadavg()[0]:.1f}")
    print(_table(rows), flush=True)


if __name__ == "__main__":
    main()
