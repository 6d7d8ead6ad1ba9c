# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""OLMo's scripts/train.py idiom: logs on every rank, limited to rank 0 by the filter a
helper installs."""
import logging

import torch
import torch.distributed as dist

from util import prepare_cli_environment

log = logging.getLogger("train")


def main():
    dist.init_process_group(backend="gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    log.info("Model built")
    log.info(f"Total number of parameters: {sum(p.numel() for p in model.parameters())}")


if __name__ == "__main__":
    prepare_cli_environment()
    main()
