# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""I-JEPA's init_distributed idiom: a failed rendezvous is caught and the process carries on
as rank 0 of 1."""
import logging
import os

import torch

logger = logging.getLogger()


def init_distributed(port=37123, rank_and_world_size=(None, None)):
    rank, world_size = rank_and_world_size
    try:
        os.environ["MASTER_PORT"] = str(port)
        torch.distributed.init_process_group(backend="nccl", world_size=world_size, rank=rank)
    except Exception as e:
        world_size, rank = 1, 0
        logger.info(f"distributed training not available {e}")
    return world_size, rank
