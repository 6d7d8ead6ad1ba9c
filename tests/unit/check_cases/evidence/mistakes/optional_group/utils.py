# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""BLIP's utils idiom: no launcher variables, no process group ("Not using distributed
mode")."""
import os

import torch


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
    else:
        print("Not using distributed mode")
        args.distributed = False
        return
    args.distributed = True
    torch.distributed.init_process_group(backend="gloo", world_size=args.world_size,
                                         rank=args.rank)
    torch.distributed.barrier()
