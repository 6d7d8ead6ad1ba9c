"""One mistake that puts the ranks out of step, chosen by name; the last rank makes it.

python -m splitsync run -n N hang_kinds.py KIND [STEPS]

Prints ``DIVERGED <wall time>`` just before the mistake, so a caller can time how long the
job takes to end after it. Kinds: skip, add, break, spin, loader, raise, shapes, slow.
"""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import splitsync


class Numbers(Dataset):
    """Samples 0..n-1; the sample ``hang_at`` never comes back on the rank that hangs."""

    def __init__(self, n: int, hang_at: int | None) -> None:
        self.n, self.hang_at = n, hang_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.hang_at:
            time.sleep(3600)  # HANG-WORKER: the DataLoader worker never delivers
        return torch.full((4,), float(i))


def diverged() -> None:
    print(f"DIVERGED {time.time():.3f}", flush=True)


def main() -> None:
    kind = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    run = splitsync.init(seed=0)
    last = run.rank == run.world_size - 1
    model = run.model(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = None
    if kind == "loader":
        hang = 2 if last else None  # the third sample this rank reads
        loader = DataLoader(Numbers(64, hang), batch_size=1, num_workers=1)
    batches = iter(loader) if loader is not None else None
    for step in range(steps):
        x = next(batches) if batches is not None else torch.ones(2, 4)  # NEXT
        if kind == "loader" and step == 1:
            diverged()
        loss = model(x).sum()
        if kind == "add" and last and step == 2:
            diverged()
            run.mean(loss.detach())  # ADD: an extra collective on one rank only
        run.backward(loss)  # BACKWARD: DDP's gradient all-reduce
        run.step(opt)
        if kind == "skip" and last and step == steps - 1:
            diverged()
            continue  # SKIP: the last rank skips the step's run.mean below
        if kind == "break" and last and step == 2:
            diverged()
            break  # BREAK: the last rank leaves the loop early
        if kind == "spin" and last and step == 2:
            diverged()
            while True:  # SPIN-LOOP: the last rank never comes back
                pass  # SPIN
        if kind == "raise" and last and step == 2:
            diverged()
            raise ValueError("a rank fails mid-step")  # RAISE
        if kind == "shapes" and step == 2:
            diverged()
            run.mean(torch.ones(3 if last else 2))  # SHAPES: different sizes per rank
        if kind == "slow" and step == 1:
            time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 5.0)  # SLOW: every rank
        run.mean(loss.detach())  # EVERY-STEP
    run.close()  # CLOSE
    print(f"rank {run.rank} finished", flush=True)


if __name__ == "__main__":
    main()
