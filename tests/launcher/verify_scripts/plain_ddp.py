"""A correct plain torch.distributed DDP script that does not use splitsync at all."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

distributed = "WORLD_SIZE" in os.environ
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
sampler = DistributedSampler(data) if distributed else None
loader = DataLoader(data, batch_size=8, sampler=sampler, shuffle=sampler is None)
model = nn.Linear(4, 1)
if distributed:
    model = DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    if sampler is not None:
        sampler.set_epoch(epoch)
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
if distributed:
    dist.destroy_process_group()
