"""Exercise 1 with splitsync: the run picks the device (this rank's GPU, else CPU).

    python examples/lesson/exercise1_device_splitsync.py
    splitsync run -n 2 examples/lesson/exercise1_device_splitsync.py   # one line per rank
"""

from __future__ import annotations

import torch

import splitsync as ss


def main() -> torch.Tensor:
    with ss.init() as run:
        t = run.to_device(torch.randn(3, 4))  # cuda:<local rank>, mps, xpu or cpu
        # Every rank prints, so the rank is in the line; run.print would print on rank 0 only.
        print(f"rank {run.rank}: tensor device: {t.device}", flush=True)
        print(f"rank {run.rank}: tensor shape: {tuple(t.shape)}", flush=True)
        return t


if __name__ == "__main__":
    main()
