"""DDP started with torch.multiprocessing.spawn instead of torchrun, on CPU (gloo)."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup(rank: int, world_size: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def train(rank: int, world_size: int) -> None:
    setup(rank, world_size)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(32, 10), torch.randint(0, 2, (32,)))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data))
    for epoch in range(3):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} done")
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = 2
    print(f"spawning {world_size} processes")  # runs once, in the parent
    mp.spawn(train, args=(world_size,), nprocs=world_size, join=True)
