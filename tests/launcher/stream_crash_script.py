"""Streaming variant of the crash test: a sharded stream read by 2 workers per rank,
shuffled, resumed at start, saved every 3 steps, exported at the end.

With ``--crash``, rank 1 kills itself with SIGKILL at step 5 on the first attempt only, so
the restart resumes from step 3: mid-epoch, after an odd number of batches per rank.
"""

from __future__ import annotations

import sys

import torch
from crash_loop import net, train  # the loop both crash scripts share
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
        model = run.model(net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        loader = run.loader(Stream(), batch_size=2, shuffle=True, buffer_size=3, num_workers=2)
        train(run, model, opt, loader, ckpt, out, crash_at=5 if crash else None)


def spawn_entry(rank: int, world: int, ckpt: str, out: str) -> None:
    main(ckpt, out, crash=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], crash="--crash" in sys.argv)
