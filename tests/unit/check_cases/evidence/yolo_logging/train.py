# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""YOLO's train.py idiom: `set_logging(opt.global_rank)` in a helper module, then plain
`logger.info` calls in the training function."""
import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from general import set_logging

logger = logging.getLogger(__name__)


def train(hyp, opt):
    logger.info("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in hyp.items()))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 3))
    logger.info("Image sizes 640 train, 640 test")
    return model


if __name__ == "__main__":
    opt = None
    set_logging(int(os.environ.get("RANK", -1)))
    dist.init_process_group("gloo")
    train({}, opt)
