"""Streams and samplers, side by side in one run.

    python benchmarks/stream_bench.py [--quick] [--reps 5]

1. Loader throughput on 2 gloo ranks: ``run.loader`` over a sharded stream (default
   ``at_end="stop"``, one all-reduce per window of batches; and ``"uneven"``, none) vs a
   hand-sharded
   torch DataLoader over the same stream (each rank and worker picks its own shards by
   ``get_worker_info``), with 0 and 2 workers, in a loop that only reads and in one that
   also all-reduces a gradient-sized tensor per step, as DDP does. Median samples/s per
   rank over ``--reps`` interleaved epochs; ratio = splitsync / hand-sharded.
2. Map-style sampler at 10^6, 10^7, 10^8 samples, splitsync's ShardSampler (bijection order)
   vs torch's DistributedSampler, each in a fresh process: epoch start (``set_epoch`` to the
   first index) and peak resident memory added by the sampler.

Prints markdown tables. Timing needs a quiet machine: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

SHARDS, PER_SHARD, DIM, BATCH = 8, 16000, 32, 64
GRAD = 1 << 16  # floats all-reduced per step in the DDP-like loop (a 64k-parameter model)


class Stream(IterableDataset):
    """``SHARDS`` shards of precomputed rows: reading costs little, so overhead shows."""

    n_shards = SHARDS

    def __init__(self) -> None:
        self.rows = torch.randn(PER_SHARD, DIM, generator=torch.Generator().manual_seed(0))

    def shard(self, num_shards: int, index: int):  # type: ignore[no-untyped-def]
        rows = self.rows
        return (rows[i] for i in range(PER_SHARD))

    def __iter__(self):  # type: ignore[no-untyped-def]
        for s in range(SHARDS):
            yield from self.shard(SHARDS, s)


class HandSharded(IterableDataset):
    """What a careful user writes: shards j, j+R, ... for reader j = worker * world + rank."""

    def __init__(self, stream: Stream, rank: int, world: int) -> None:
        self.stream, self.rank, self.world = stream, rank, world

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        workers, wid = (info.num_workers, info.id) if info else (1, 0)
        readers = workers * self.world
        for s in range(wid * self.world + self.rank, SHARDS, readers):
            yield from self.stream.shard(SHARDS, s)


def _epoch(loader, step: bool) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    grad = torch.zeros(GRAD)
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += batch.shape[0]
        if step:  # what DDP's backward does every step: one gradient all-reduce
            torch.distributed.all_reduce(grad)
    return time.perf_counter() - t0, n


def loader_worker(rank: int, world: int, reps: int) -> dict[str, list[float]]:
    import splitsync as ss

    out: dict[str, list[float]] = {}
    with ss.init(seed=0) as run:
        stream = Stream()
        for workers in (0, 2):
            loaders = {
                "hand-sharded DataLoader": DataLoader(HandSharded(stream, rank, world),
                                                      batch_size=BATCH, num_workers=workers),
                "run.loader (at_end=stop)": run.loader(stream, batch_size=BATCH,
                                                       num_workers=workers),
                "run.loader (at_end=uneven)": run.loader(stream, batch_size=BATCH,
                                                         num_workers=workers, at_end="uneven"),
            }
            for _ in range(reps):  # interleaved, so drift hits every variant alike
                for step in (False, True):
                    for name, loader in loaders.items():
                        run.barrier()
                        dt, n = _epoch(loader, step)
                        out.setdefault(f"{name}|{workers}|{step}", []).append(n / dt)
        # the agreement's own cost: the same all-reduce, alone, per step
        t = torch.zeros(1, dtype=torch.int64)
        run.barrier()
        t0 = time.perf_counter()
        for _ in range(2000):
            torch.distributed.all_reduce(t)
        out["allreduce_us"] = [(time.perf_counter() - t0) / 2000 * 1e6]
    return out


SAMPLER_CODE = r"""
import json, resource, sys, time
import torch
kind, n = sys.argv[1], int(sys.argv[2])
class Sized:
    def __len__(self): return n
    def __getitem__(self, i): return i
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if kind == "splitsync":
    from splitsync.data.loader import ShardSampler
    s = ShardSampler(Sized(), 2, 0, True, 0, order="bijection")
else:
    s = torch.utils.data.DistributedSampler(Sized(), 2, 0, True, 0)
t0 = time.perf_counter()
s.set_epoch(1)
it = iter(s)
first = next(it)
start = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(200000): next(it)
per_index = (time.perf_counter() - t0) / 200000
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"start_s": start, "peak_mb": (peak - base) / 1024, "ns_per_index": per_index * 1e9}))
"""


def sampler_row(kind: str, n: int) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", SAMPLER_CODE, kind, str(n)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="3 reps, samplers up to 10^7")
    args = p.parse_args(argv)
    reps = 3 if args.quick else args.reps
    from splitsync.testing import spawn

    res = spawn(loader_worker, 2, reps, timeout=1800)
    print(f"## Loader throughput: 2 gloo ranks, {SHARDS} shards x {PER_SHARD} rows, batch "
          f"{BATCH}, median of {reps} epochs (samples/s per rank, rank 0)\n")
    print("| loop | workers | hand-sharded DataLoader | run.loader (stop) | ratio | "
          "run.loader (uneven) | ratio |")
    print("|---|---|---|---|---|---|---|")
    r0 = res[0]
    for step in (False, True):
        loop = f"+ {GRAD // 1024}k-float all-reduce per step" if step else "loader only"
        for workers in (0, 2):
            hand = statistics.median(r0[f"hand-sharded DataLoader|{workers}|{step}"])
            stop = statistics.median(r0[f"run.loader (at_end=stop)|{workers}|{step}"])
            une = statistics.median(r0[f"run.loader (at_end=uneven)|{workers}|{step}"])
            print(f"| {loop} | {workers} | {hand:,.0f} | {stop:,.0f} | {stop / hand:.2f}x | "
                  f"{une:,.0f} | {une / hand:.2f}x |")
    print(f"\nagreement all-reduce alone (1 int64, gloo, 2 ranks; once per window of up to 64 "
          "batches): "
          f"{r0['allreduce_us'][0]:.0f} us per step\n")

    sizes = [10**6, 10**7] if args.quick else [10**6, 10**7, 10**8]
    print("## Map-style sampler, 2 replicas, one fresh process per cell\n")
    print("| n | DistributedSampler start | splitsync start | DistributedSampler peak MB | "
          "splitsync peak MB | DistributedSampler ns/index | splitsync ns/index |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        ds, ss_ = sampler_row("torch", n), sampler_row("splitsync", n)
        print(f"| {n:.0e} | {ds['start_s']:.3f} s | {ss_['start_s'] * 1e3:.2f} ms | "
              f"{ds['peak_mb']:,.0f} | {ss_['peak_mb']:,.1f} | {ds['ns_per_index']:.0f} | "
              f"{ss_['ns_per_index']:.0f} |")


if __name__ == "__main__":
    main()
