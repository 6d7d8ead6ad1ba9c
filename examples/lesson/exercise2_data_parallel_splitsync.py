"""Exercise 2 with splitsync: a global batch of 8 split over N processes, outputs gathered.

    python examples/lesson/exercise2_data_parallel_splitsync.py            # 1 process: (8, 2)
    splitsync run -n 2 examples/lesson/exercise2_data_parallel_splitsync.py # (4, 2) per rank
    python examples/lesson/exercise2_data_parallel_splitsync.py --strategy dp  # legacy DP

With DDP each process runs its own slice of the batch: (8 / N, 10) in, (8 / N, 2) out.
``run.gather`` concatenates the slices along dim 0, giving (8, 2) again -- the same split and
merge DataParallel does inside one process, but with one process per device.
"""

from __future__ import annotations

import argparse

import torch
from simplenet import SimpleNet
from torch.utils.data import TensorDataset

import splitsync as ss


def main(argv: list[str] | None = None, batch: int = 8) -> tuple[int, ...]:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="auto", help="auto, single, ddp or dp")
    args = p.parse_args(argv)
    with ss.init(seed=0, strategy=args.strategy) as run:
        model = run.model(SimpleNet())
        if batch % run.world_size:
            raise SystemExit(f"batch {batch} does not split evenly over {run.world_size} processes")
        x = torch.randn(batch, 10, generator=torch.Generator().manual_seed(0))
        # The index travels with each row so the gathered rows can be put back in order.
        loader = run.loader(TensorDataset(x, torch.arange(batch)),
                            batch_size=batch // run.world_size)
        xb, idx = next(iter(loader))
        with torch.no_grad():
            out = model(xb)
            print(f"rank {run.rank}: input {tuple(xb.shape)} -> output {tuple(out.shape)}",
                  flush=True)
            gathered = run.gather(out)
            order = run.gather(idx).argsort()
            full = run.unwrap(model)(run.to_device(x))  # one pass over all 8 rows
        same = torch.allclose(gathered[order], full, atol=1e-6)
        run.print(f"gathered output shape: {tuple(gathered.shape)}; same as one pass: {same}")
        return tuple(gathered.shape)


if __name__ == "__main__":
    main()
