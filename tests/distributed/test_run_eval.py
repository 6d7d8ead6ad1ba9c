"""Exact evaluation: padded duplicates never count, whatever the world size."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import splitsync
from splitsync.testing import spawn


def _dataset() -> TensorDataset:
    from sklearn.datasets import load_digits

    digits = load_digits()  # 1,797 samples: 1797 % 2 == 1 and 1797 % 3 == 0
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    return TensorDataset(x, torch.tensor(digits.target), torch.arange(len(x)))


def _evaluate(rank: int, world: int, batch_size: int) -> tuple[int, int, list[int]]:
    with splitsync.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(64, 10))
        loader = run.loader(_dataset(), batch_size=batch_size)
        correct, seen, ids = 0, 0, []
        with torch.no_grad():
            for x, y, idx in loader:
                hits = run.gather_for_metrics((model(x).argmax(1) == y).long())
                correct += int(hits.sum())
                seen += hits.numel()
                ids += run.gather_for_metrics(idx).tolist()
        return correct, seen, ids


def _direct() -> int:
    x, y, _ = _dataset().tensors
    torch.manual_seed(0)
    model = nn.Linear(64, 10)
    with torch.no_grad():
        return int((model(x).argmax(1) == y).sum())


# 1 and 3 (a split the ranks do not share evenly) in the suite, 2 in the extended trials
@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.extended), 3])
def test_accuracy_is_identical_for_any_world_size(world: int) -> None:
    out = spawn(_evaluate, world, 64)
    expected = _direct()
    for correct, seen, ids in out:
        assert seen == 1797 and sorted(ids) == list(range(1797))
        assert correct == expected
