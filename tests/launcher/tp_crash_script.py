"""Training script for the TP crash test: tp 2 x dp_shard 2, accumulation 2, ``count=`` over
uneven items, a background save every 3 steps, resumed at start; the full weights written by
rank 0 at the end.

With ``--crash``, rank 1 kills itself with SIGKILL at step 7 on the first attempt only.
Usage: ``tp_crash_script.py CKPT OUT [--crash]``.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.utils.data import Dataset

import splitsync as ss

STEPS = 12  # optimizer steps, each of 2 micro-batches


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(6, 16, dtype=torch.float64)
        self.down = nn.Linear(16, 1, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Data(Dataset):
    """Samples with a weight: 0 or 1 (a masked item), so micro-batches count unevenly."""

    def __len__(self) -> int:
        return 101

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(6, generator=g, dtype=torch.float64)
        return x, x.sum().unsqueeze(0), torch.tensor(float(i % 3 != 0), dtype=torch.float64)


def main(ckpt: str, out: str, crash: bool) -> None:
    with ss.init(seed=0, mesh={"dp_shard": -1, "tp": 2}, accumulate=2,
                 save_blocking=False) as run:
        model = run.model(Block(), tp_plan={"up": ColwiseParallel(), "down": RowwiseParallel()})
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        loader = run.loader(Data(), batch_size=3, shuffle=True)
        state = run.resume(ckpt, model=model, optimizer=opt)
        step = state.step
        for _ in run.epochs(100, start=state.epoch):
            for x, y, w in loader:
                n = w.sum()
                per_item = ((model(x) - y) ** 2).squeeze(1) * w
                loss = per_item.sum() / n.clamp(min=1)  # the mean over the real items
                run.backward(loss, count=int(n))
                if run.step(opt).stepped:
                    step += 1
                    if step == 7 and crash and run.rank == 1 and run.env.restart_count == 0:
                        os.kill(os.getpid(), signal.SIGKILL)
                    if step % 3 == 0:
                        run.save(ckpt)
                if step == STEPS:
                    break
            if step == STEPS:
                break
        full = {k: v.full_tensor() if isinstance(v, DTensor) else v
                for k, v in model.state_dict().items()}
        if run.rank == 0:
            torch.save(full, out)
        run.print(f"restart {run.env.restart_count}: resumed at step {state.step}, "
                  f"ended at {step}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], crash="--crash" in sys.argv)
