# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""The script advances the sampler the helper built: `train_sampler.set_epoch(epoch)`."""
import torch
import torch.distributed as dist

from data import build_loader

dist.init_process_group(backend="gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader, train_sampler = build_loader(torch.utils.data.TensorDataset(torch.randn(64, 4)), 8)
for epoch in range(3):
    train_sampler.set_epoch(epoch)
    for (x,) in loader:
        model(x).sum().backward()
        optimizer.step()
