# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""apex's simple DDP example idiom: `--local_rank` defaults to 0 and only the old
`torch.distributed.launch` passes it, so under torchrun every process uses cuda:0."""
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", default=0, type=int)
args = parser.parse_args()
torch.cuda.set_device(args.local_rank)
torch.distributed.init_process_group(backend="nccl", init_method="env://")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda())
