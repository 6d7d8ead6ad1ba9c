"""The lesson's central mistake: a DDP script whose DataLoader has no DistributedSampler, so
every rank trains on the whole data set (N copies of one epoch, not one epoch split N ways)."""

import os

import torch
import torch.distributed as dist
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def train() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Linear(10, 2))
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    dataset = TensorDataset(torch.randn(1000, 10), torch.randint(0, 2, (1000,)))
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for _epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), os.path.join("out", "model.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
