# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""A data helper that builds the sampler and the loader and returns both."""
import torch
from torch.utils.data import DataLoader, DistributedSampler


def build_loader(dataset, batch_size):
    sampler = DistributedSampler(dataset, shuffle=True)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler
