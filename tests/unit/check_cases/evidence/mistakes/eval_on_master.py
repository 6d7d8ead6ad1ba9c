# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""nanoGPT's idiom: `estimate_loss()` runs the DDP-wrapped model, and only the master
process calls it."""
import os

import torch
from torch.distributed import init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

init_process_group(backend="gloo")
master_process = int(os.environ["RANK"]) == 0
model = DDP(torch.nn.Linear(4, 4))
optimizer = torch.optim.AdamW(model.parameters())


@torch.no_grad()
def estimate_loss():
    losses = torch.zeros(10)
    for k in range(10):
        losses[k] = model(torch.randn(2, 4)).sum().item()
    return losses.mean()


for iter_num in range(100):
    if iter_num % 10 == 0 and master_process:
        print(f"step {iter_num}: val loss {estimate_loss():.4f}")
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
