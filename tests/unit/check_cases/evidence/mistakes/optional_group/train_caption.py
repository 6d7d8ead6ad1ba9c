# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""BLIP's train_caption.py idiom: a barrier at the end of every epoch, without
`if args.distributed`, although a one-process run has no process group."""
import argparse

import torch
import torch.distributed as dist

import utils


def main(args):
    utils.init_distributed_mode(args)
    model = torch.nn.Linear(4, 4)
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    for epoch in range(3):
        model(torch.randn(2, 4)).sum().backward()
        dist.barrier()


if __name__ == "__main__":
    main(argparse.ArgumentParser().parse_args())
