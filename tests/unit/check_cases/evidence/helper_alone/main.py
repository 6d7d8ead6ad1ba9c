# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""The script beside engine.py: process group, print override, then the helper's loop."""
import builtins

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from engine import train_one_epoch


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        if is_master or kwargs.pop("force", False):
            builtin_print(*args, **kwargs)

    builtins.print = print


if __name__ == "__main__":
    dist.init_process_group("gloo")
    setup_for_distributed(dist.get_rank() == 0)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 4))
    sampler = torch.utils.data.DistributedSampler(torch.utils.data.TensorDataset(torch.randn(8, 4)))
    for epoch in range(2):
        sampler.set_epoch(epoch)
        train_one_epoch(model, [], torch.optim.SGD(model.parameters(), lr=0.1), epoch)
