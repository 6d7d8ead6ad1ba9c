"""The lesson's example 3, corrected. Launch: torchrun --nproc_per_node=2 fixed_example3.py"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class SimpleNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(x)


def train(rank: int, world_size: int, local_rank: int) -> None:
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    torch.manual_seed(42)  # same seed on every rank, before the model is built
    model = SimpleNet().to(device)
    ddp_model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    criterion = nn.CrossEntropyLoss()

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 10, generator=generator),
                         torch.randint(0, 2, (64,), generator=generator))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(data, batch_size=4, sampler=sampler)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        total = torch.zeros((), device=device)
        for input_data, labels in loader:
            input_data, labels = input_data.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(ddp_model(input_data), labels)
            loss.backward()
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}, mean loss {total.item() / world_size / len(loader):.4f}")

    if rank == 0:
        torch.save(model.state_dict(), "simplenet.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
