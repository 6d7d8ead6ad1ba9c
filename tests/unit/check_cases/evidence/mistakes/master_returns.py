"""open_clip's main(): rank 0 checks whether the experiment exists and returns; the other
ranks carry on into training and wait at the first collective for a rank that has left."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def is_master(args):
    return args.rank == 0


def main(args):
    dist.init_process_group("gloo")
    args.rank = dist.get_rank()
    if is_master(args):
        log_path = os.path.join(args.logs, "out.log")
        if os.path.exists(log_path):
            print("Error. Experiment already exists.")
            return -1
    model = DDP(torch.nn.Linear(4, 1))
    for _ in range(10):
        model(torch.randn(2, 4)).sum().backward()
    dist.barrier()

