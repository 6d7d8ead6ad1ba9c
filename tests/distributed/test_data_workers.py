"""DataLoader workers: distinct seeds per rank and worker, reproducible across runs."""

from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset, get_worker_info

import splitsync
from splitsync.testing import spawn


class Seeds(Dataset):
    """Each item reports the worker's torch seed and a python random draw."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[int, int, float]:
        info = get_worker_info()
        return info.id if info else -1, torch.initial_seed(), random.random()


def _seeds(rank: int, world: int) -> list[list[tuple[int, int, float]]]:
    with splitsync.init(seed=1) as run:
        passes = []
        for _ in range(2):  # two identical loaders: same seeds, i.e. reproducible
            loader = run.loader(Seeds(), batch_size=1, num_workers=2, collate_fn=lambda b: b[0])
            passes.append(sorted(set(loader)))
        return passes


def test_worker_seeds_distinct_per_rank_and_worker_and_reproducible() -> None:
    out = spawn(_seeds, 2, timeout=180)
    for passes in out:
        assert passes[0] == passes[1]  # reproducible
    per_worker = {(r, w): (s, x) for r, passes in enumerate(out) for w, s, x in passes[0]}
    assert len(per_worker) == 4  # 2 ranks x 2 workers
    assert len({s for s, _ in per_worker.values()}) == 4  # distinct torch seeds
    assert len({x for _, x in per_worker.values()}) >= 4  # python RNG follows torch's seed
