"""Benchmark workloads: a model factory, a dataset and a batch size each.

W1 is a tiny MLP whose step is so short that any per-step overhead shows; W2 is a small
CNN on the 8x8 digits images. The training loops compared on them are in ``bench.loops``
and ``bench.otherloops``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

__all__ = ["Workload", "WORKLOADS", "make_workload"]


@dataclass(frozen=True)
class Workload:
    """A model factory, a dataset and the per-process batch size."""

    name: str
    title: str
    build: Callable[[], nn.Module]
    dataset: Dataset
    batch_size: int
    lr: float = 0.05


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def _synthetic(n: int, shape: tuple[int, ...], seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g))


def _digits() -> tuple[TensorDataset, str]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # scikit-learn is optional: same shapes, random pixels
        return _synthetic(1792, (1, 8, 8), 1), "synthetic 8x8 images (scikit-learn not installed)"
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return TensorDataset(x, torch.tensor(d.target, dtype=torch.long)), "scikit-learn digits"


def make_workload(name: str) -> Workload:
    """W1 (tiny MLP, batch 32) or W2 (digits CNN, batch 64)."""
    if name == "W1":
        return Workload("W1", "tiny MLP 32-64-64-10, batch 32", _mlp, _synthetic(4096, (32,), 0), 32)
    if name == "W2":
        data, source = _digits()
        return Workload("W2", f"digits CNN ({source}), batch 64", _cnn, data, 64)
    raise ValueError(f"Unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}.")


WORKLOADS = ("W1", "W2")
