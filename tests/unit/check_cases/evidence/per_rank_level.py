# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""I-JEPA's src/train.py idiom: every rank logs at INFO until the group is up, then ranks
above 0 raise their level to ERROR."""
import logging
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

logging.basicConfig(stream=sys.stdout, level=logging.INFO)
logger = logging.getLogger()


def main(args):
    dist.init_process_group("gloo")
    world_size, rank = dist.get_world_size(), dist.get_rank()
    logger.info(f"Initialized (rank/world-size) {rank}/{world_size}")
    if rank > 0:
        logger.setLevel(logging.ERROR)
    torch.manual_seed(0)
    encoder = DistributedDataParallel(torch.nn.Linear(8, 8), static_graph=True)
    for epoch in range(args.epochs):
        logger.info("Epoch %d" % (epoch + 1))


if __name__ == "__main__":
    main(None)
