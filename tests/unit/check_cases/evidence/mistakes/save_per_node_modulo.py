# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""PyTorch's ImageNet example idiom: the checkpoint is written when `args.rank %
ngpus_per_node == 0`, which is the first process of every node."""
import shutil

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


def main_worker(gpu, ngpus_per_node, args):
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 4))
    for epoch in range(args.epochs):
        if not args.multiprocessing_distributed or (args.multiprocessing_distributed
                                                    and args.rank % ngpus_per_node == 0):
            save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict()}, False)


if __name__ == "__main__":
    main_worker(0, 1, None)
