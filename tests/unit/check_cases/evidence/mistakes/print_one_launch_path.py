# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""MoCo's main_moco.py idiom: prints are silenced only under --multiprocessing-distributed,
and by the GPU index: under torchrun every rank prints."""
import builtins

import torch.distributed as dist


def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    if args.multiprocessing_distributed and args.gpu != 0:
        def print_pass(*args):
            pass
        builtins.print = print_pass
    dist.init_process_group(backend="gloo", rank=args.rank, world_size=args.world_size)
    print("=> creating model")
