"""Training script for the crash test: resumes at start, saves every 3 steps, exports at the end.

With ``--crash``, rank 1 kills itself with SIGKILL at step 7 on the first attempt only.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss


class Data(Dataset):
    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(6, generator=torch.Generator().manual_seed(i))
        return x, x.sum().unsqueeze(0)


def main(ckpt: str, out: str, crash: bool) -> None:
    with ss.init(seed=0, deterministic=True) as run:
        net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        model = run.model(net)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        loader = run.loader(Data(), batch_size=4, shuffle=True)
        state = run.resume(ckpt, model=model, optimizer=opt)
        step = state.step
        for _ in run.epochs(3, start=state.epoch):
            for x, y in loader:
                run.backward(F.mse_loss(model(x), y))
                run.step(opt)
                step += 1
                if crash and step == 7 and run.rank == 1 and run.env.restart_count == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step % 3 == 0:
                    run.save(ckpt)
        run.export(out)
        run.print(f"restart {run.env.restart_count}: resumed at step {state.step}, ended at {step}")


def spawn_entry(rank: int, world: int, ckpt: str, out: str) -> None:
    main(ckpt, out, crash=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], crash="--crash" in sys.argv)
