# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""MAE/DeiT's util/misc.py idiom: `init_distributed_mode` pins the backend through an
attribute, then passes the attribute to init_process_group."""
import os

import torch


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    else:
        args.distributed = False
        return
    args.distributed = True
    args.dist_backend = "nccl"
    torch.distributed.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                         world_size=args.world_size, rank=args.rank)
