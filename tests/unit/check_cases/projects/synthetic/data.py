"""A synthetic dataset drawn when it is built."""
import torch
from torch.utils.data import Dataset


class NoiseSet(Dataset):
    def __init__(self, n):
        self.items = [(torch.rand(8), torch.rand(1)) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class SeededNoiseSet(Dataset):
    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = [torch.rand(8, generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]
