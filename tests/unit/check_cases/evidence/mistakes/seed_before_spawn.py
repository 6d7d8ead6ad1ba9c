# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""PyTorch's ImageNet example idiom: `main()` seeds, then starts the workers with mp.spawn;
the spawned `main_worker` never seeds, so every rank draws its own weights."""
import random

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args):
    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
    ngpus_per_node = torch.cuda.device_count()
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


def main_worker(gpu, ngpus_per_node, args):
    dist.init_process_group("gloo", rank=gpu, world_size=ngpus_per_node)
    model = torch.nn.Linear(8, 8)
    model = DDP(model)
    return model


if __name__ == "__main__":
    main(None)
