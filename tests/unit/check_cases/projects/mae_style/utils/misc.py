"""Helpers in the research-code style: rank-0-only print installed process-wide."""
import builtins
import os

import torch.distributed as dist


def quiet_other_ranks(is_master):
    original = builtins.print

    def print(*args, **kwargs):
        if is_master or kwargs.pop("force", False):
            original(*args, **kwargs)

    builtins.print = print


def start_distributed(args):
    args.rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    quiet_other_ranks(args.rank == 0)
