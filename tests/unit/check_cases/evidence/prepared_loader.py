# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""Accelerate's fp8 DDP benchmark idiom, with the loaders handed to `accelerator.prepare`,
which replaces their sampler by a sharding one."""
import torch
from accelerate import Accelerator
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

accelerator = Accelerator()
torch.manual_seed(0)
train_dataloader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, shuffle=True)
model = torch.nn.Linear(4, 1).to(accelerator.device)
model = DDP(model, device_ids=[accelerator.local_process_index])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimizer, train_dataloader = accelerator.prepare(optimizer, train_dataloader)
for (x,) in train_dataloader:
    model(x).sum().backward()
    optimizer.step()
