"""The lesson's example 2 without DataParallel: one process per device with DDP.

Launch: torchrun --nproc_per_node=2 fixed_example2.py  (gloo on CPU, nccl on GPUs)
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class SimpleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(x)


def main() -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(device_id=device if device.type == "cuda" else None)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(SimpleNet().to(device))
    # the global batch of 16 is split between the processes, as DataParallel split it
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(16, 10, generator=generator)[rank::world_size].to(device)
    labels = torch.randint(0, 2, (16,), generator=generator)[rank::world_size].to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()
    optimizer.zero_grad()
    loss = criterion(model(inputs), labels)
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"one data-parallel step on {world_size} processes done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
