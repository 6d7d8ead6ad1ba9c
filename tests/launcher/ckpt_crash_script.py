"""Training script for the crash test: resumes at start, saves every 3 steps, exports the model and
its EMA at the end.

With ``--crash``, rank 1 kills itself with SIGKILL at step 7 on the first attempt only.
``--size N``: the dataset's size (default 30).
"""

from __future__ import annotations

import sys

import torch
from crash_loop import net, train  # the loop both crash scripts share
from torch.utils.data import Dataset

import splitsync as ss


class Data(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(6, generator=torch.Generator().manual_seed(i))
        return x, x.sum().unsqueeze(0)


def main(ckpt: str, out: str, crash: bool, n: int) -> None:
    with ss.init(seed=0, deterministic=True) as run:
        model = run.model(net())
        ema = run.ema(model, decay=0.9)  # saved and restored by run.save/run.resume
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        loader = run.loader(Data(n), batch_size=4, shuffle=True)
        train(run, model, opt, loader, ckpt, out, crash_at=7 if crash else None, ema=ema)


def spawn_entry(rank: int, world: int, ckpt: str, out: str, n: int) -> None:
    main(ckpt, out, crash=False, n=n)


if __name__ == "__main__":
    size = int(sys.argv[sys.argv.index("--size") + 1]) if "--size" in sys.argv else 30
    main(sys.argv[1], sys.argv[2], crash="--crash" in sys.argv, n=size)
