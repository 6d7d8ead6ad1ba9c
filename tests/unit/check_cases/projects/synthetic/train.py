"""torchrun script: split, wrap, save once per machine."""
import os

import torch
import torch.distributed as dist
from data import NoiseSet
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, random_split


def main():
    dist.init_process_group("gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    full = NoiseSet(100)
    train, test = random_split(full, [80, 20])
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        if local_rank == 0:
            torch.save(model.module.state_dict(), "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
