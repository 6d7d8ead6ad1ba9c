# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""A set-up helper seen in tutorials: the CPU fallback keeps `device_ids=[rank]`, which DDP
refuses for a CPU module."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def build(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    if torch.cuda.is_available():
        model = DDP(model.to(rank), device_ids=[rank])
    else:
        model = DDP(model, device_ids=[rank])
    return model
