# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""A per-rank `continue` on a NaN loss before the backward: the rank that skips pairs its
next all-reduce with the other ranks' current one (issue 33's example)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    if torch.isnan(loss):
        continue
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
