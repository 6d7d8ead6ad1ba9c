"""Resume a DDP run at another world size: the epoch finishes on exactly the unseen samples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss
from splitsync.testing import spawn

N = 29  # odd, so the resumed shards are padded and trim_padding matters


class Ids(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i


def phase(rank: int, world: int, root: str, stop_after: int | None) -> tuple[int, list[int]]:
    """Train epoch 0; with ``stop_after`` save after that many steps and stop there."""
    with ss.init(seed=3) as run:
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = run.loader(Ids(), batch_size=4, shuffle=True)
        state = run.resume(root, model=model, optimizer=opt)
        seen: list[int] = []
        step = state.step
        for _ in run.epochs(1, start=state.epoch):
            for x, idx in loader:
                run.backward(model(x).sum())
                run.step(opt)
                step += 1
                seen.extend(loader.trim_padding(idx).tolist())
                if step == stop_after:
                    run.save(root)
                    return state.epoch, seen
        return state.epoch, seen


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_resume_mid_epoch_at_other_world_sizes(tmp_path: Path) -> None:
    root = str(tmp_path)
    first = spawn(phase, 2, root, 2, timeout=60)
    before = [i for _, seen in first for i in seen]
    assert len(before) == 2 * 2 * 4  # 2 ranks x 2 steps x batch 4
    for world in (1, 3):
        # One rank needs no process group: run it here, which also keeps the test quick.
        second = [phase(0, 1, root, None)] if world == 1 else spawn(phase, world, root, None,
                                                                    timeout=60)
        assert all(epoch == 0 for epoch, _ in second)
        after = [i for _, seen in second for i in seen]
        counts = Counter(before + after)
        assert sorted(counts) == list(range(N)), f"world {world}: skipped samples"
        assert max(counts.values()) == 1, f"world {world}: samples seen twice"
