# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""An apex/AMP-era training loop: the fp32 branch accumulates under `model.no_sync()`, the
fp16 branch (GradScaler) calls backward outside it, so only fp32 runs skip the all-reduce."""
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(args, loader):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler(enabled=args.fp16)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % args.accum == 0
        if args.fp16:
            with torch.autocast("cuda"):
                loss = (model(x) - y).pow(2).mean() / args.accum
            scaler.scale(loss).backward()
        else:
            with contextlib.nullcontext() if last else model.no_sync():
                loss = (model(x) - y).pow(2).mean() / args.accum
                loss.backward()
        if last:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
