# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""A research-code idiom: each worker snapshots the code into the run folder and opens the
run's log with mode "w"; every rank does both, on the same paths."""
import os
import shutil

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main_worker(gpu, args):
    dist.init_process_group("gloo", rank=gpu, world_size=args.world_size)
    torch.manual_seed(0)
    shutil.copytree("src", os.path.join(args.out_dir, "code"), dirs_exist_ok=True)
    log = open(os.path.join(args.out_dir, "log.txt"), "w")
    model = DDP(torch.nn.Linear(4, 4))
    log.write("started\n")
    return model


if __name__ == "__main__":
    main_worker(0, None)
