"""The lesson's SimpleNet: one linear layer from 10 features to 2 classes."""

from __future__ import annotations

import torch
from torch import nn


class SimpleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def toy_data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random 10-feature rows whose label (0/1) a linear layer can learn."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return x, y
