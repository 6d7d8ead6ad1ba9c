# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""DiT's train.py idiom: rank 0 gets a real logger, every other rank a logger whose only
handler is a NullHandler, so `logger.info` in the loop prints once."""
import logging

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def create_logger(logging_dir):
    if dist.get_rank() == 0:  # real logger
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s",
                            handlers=[logging.StreamHandler(),
                                      logging.FileHandler(f"{logging_dir}/log.txt")])
        logger = logging.getLogger(__name__)
    else:  # dummy logger (does nothing)
        logger = logging.getLogger(__name__)
        logger.addHandler(logging.NullHandler())
    return logger


def main(args):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.global_seed)
    logger = create_logger(args.results_dir)
    model = DDP(torch.nn.Linear(4, 4))
    logger.info(f"Parameters: {sum(p.numel() for p in model.parameters()):,}")
    for epoch in range(args.epochs):
        logger.info(f"Beginning epoch {epoch}...")


if __name__ == "__main__":
    main(None)
