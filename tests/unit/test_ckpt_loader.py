"""Where a loader stands in its epoch, as recorded in a checkpoint and restored from it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss


class Logged(Dataset):
    """10 samples (batch 3: 4 batches an epoch, the last one short) that log every read."""

    def __init__(self) -> None:
        self.reads: list[int] = []

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[torch.Tensor]:
        self.reads.append(i)
        return (torch.tensor(i),)


def _run(root: Path, made_after_resume: bool, stop: tuple[int, int] | None,
         save_before_epoch: int | None = None) -> tuple[list[int], list[tuple[int, list[int]]]]:
    """Iterate 3 epochs, saving and stopping after batch ``stop=(epoch, batch)``."""
    seen: list[tuple[int, list[int]]] = []
    data = Logged()
    with ss.init(seed=1) as run:
        model = run.model(nn.Linear(1, 1))
        if not made_after_resume:
            loader = run.loader(data, batch_size=3, shuffle=True)
        state = run.resume(root, model=model)
        if made_after_resume:
            loader = run.loader(data, batch_size=3, shuffle=True)
        for epoch in run.epochs(3, start=state.epoch):
            if epoch == save_before_epoch:
                run.save(root, step=100)
                return data.reads, seen
            for b, (x,) in enumerate(loader):
                seen.append((epoch, x.tolist()))
                if (epoch, b) == stop:
                    run.save(root, step=epoch * 10 + b)
                    return data.reads, seen
    return data.reads, seen


def test_mid_epoch_position_for_a_loader_made_after_resume(tmp_path: Path) -> None:
    _, full = _run(tmp_path / "a", False, None)
    _, first = _run(tmp_path / "b", False, (1, 1))
    reads, rest = _run(tmp_path / "b", True, None)
    assert first + rest == full
    assert reads == [i for _, batch in rest for i in batch]  # skipped by index, never read
    assert rest[0][0] == 1 and len(rest) == 2 + 4  # two batches left of epoch 1, then epoch 2


def test_epoch_boundary_and_not_yet_started_epoch(tmp_path: Path) -> None:
    _, full = _run(tmp_path / "a", False, None)
    _, first = _run(tmp_path / "b", False, (0, 3))  # the last batch of epoch 0
    _, rest = _run(tmp_path / "b", False, None)
    assert first + rest == full and rest[0][0] == 1
    # Saved when epoch 2 was set but not begun: resume starts epoch 2 at its first batch.
    _, first = _run(tmp_path / "c", False, None, save_before_epoch=2)
    _, rest = _run(tmp_path / "c", False, None)
    assert first + rest == full and rest[0][0] == 2
