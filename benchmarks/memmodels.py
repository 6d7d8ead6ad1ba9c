"""Three small models ``plan --memory`` is checked against: an MLP, a tiny GPT and a CNN.

Each entry: a factory (called without arguments), one sample's input shape and dtype.
"""

from __future__ import annotations

import torch
from gpt import GPT, SIZES
from torch import nn

__all__ = ["MODELS", "mlp", "tiny_gpt", "cnn", "sample"]


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), *(Residual(128) for _ in range(4)),
                         nn.Linear(128, 10))


def tiny_gpt() -> nn.Module:
    return GPT(SIZES["tiny"])


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv, self.norm = nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x)))


def cnn() -> nn.Module:
    return nn.Sequential(ConvBlock(3, 16), ConvBlock(16, 32), nn.MaxPool2d(2),
                         ConvBlock(32, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, 10))


MODELS = {
    "mlp": (mlp, (64,), torch.float32),
    "tiny-gpt": (tiny_gpt, (32,), torch.long),
    "cnn": (cnn, (3, 16, 16), torch.float32),
}


def sample(name: str, batch: int, seed: int = 0) -> torch.Tensor:
    """A random batch for model ``name``."""
    _, shape, dtype = MODELS[name]
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(batch, *shape, generator=g)
    return torch.randint(0, 256, (batch, *shape), generator=g)
