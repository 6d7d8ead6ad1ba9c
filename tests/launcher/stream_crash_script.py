"""Streaming variant of the crash test: a sharded stream read by 2 workers per rank,
shuffled, resumed at start, saved every 3 steps, exported at the end.

With ``--crash``, rank 1 kills itself with SIGKILL at step 5 on the first attempt only, so
the restart resumes from step 3: mid-epoch, after an odd number of batches per rank.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import IterableDataset

import splitsync as ss


class Stream(IterableDataset):
    """8 shards of 4 generated samples: shard-level over 2 ranks x 2 workers."""

    n_shards = 8

    def shard(self, num_shards: int, index: int):  # type: ignore[no-untyped-def]
        for i in range(index * 4, index * 4 + 4):
            x = torch.randn(6, generator=torch.Generator().manual_seed(i))
            yield x, x.sum().unsqueeze(0)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for s in range(self.n_shards):
            yield from self.shard(self.n_shards, s)


def main(ckpt: str, out: str, crash: bool) -> None:
    with ss.init(seed=0, deterministic=True) as run:
        net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        model = run.model(net)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        loader = run.loader(Stream(), batch_size=2, shuffle=True, buffer_size=3, num_workers=2)
        state = run.resume(ckpt, model=model, optimizer=opt)
        step = state.step
        for _ in run.epochs(3, start=state.epoch):
            for x, y in loader:
                run.backward(F.mse_loss(model(x), y))
                run.step(opt)
                step += 1
                if crash and step == 5 and run.rank == 1 and run.env.restart_count == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step % 3 == 0:
                    run.save(ckpt)
        run.export(out)
        run.print(f"restart {run.env.restart_count}: resumed at step {state.step}, ended at {step}")


def spawn_entry(rank: int, world: int, ckpt: str, out: str) -> None:
    main(ckpt, out, crash=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], crash="--crash" in sys.argv)
