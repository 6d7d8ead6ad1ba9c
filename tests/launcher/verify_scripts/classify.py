"""A small data-parallel training script, correct by default; flags break it on purpose.

Faults (each has one likely cause in ``splitsync verify``):
--reduction sum   loss summed over the batch instead of averaged
--plain-loader    a plain DataLoader: every rank reads all the data (no sampler)
--dropout P       dropout (a real 1-vs-N difference: different masks)
--batchnorm       plain BatchNorm (statistics over B/N samples per rank)
--no-set-epoch    epochs counted with range(): the sampler's epoch never advances
--world-seed      the model is seeded with the world size
--lr-by-world     the learning rate depends on the world size
--sum-micro       micro-step losses summed, not averaged (a port that scales the loss back
                  up by the accumulation; caught by --accumulate K)
--params-before   the optimizer takes a parameter list collected before run.model (right
                  under DDP, stale under FSDP; caught by --strategies ddp,fsdp)
--ckpt-no-opt     the checkpoint holds the model but not the optimizer (caught by --resume)
--sched-micro     a warmup scheduler stepped after every run.step call, micro-steps
                  included (caught by --accumulate K)
--no-shuffle      the training loader is made without shuffle=True (verify says so)

Correct patterns that verify must pass:
--ckpt DIR        run.resume(DIR, ...) before training and run.save() every step
--run-dir DIR     init(run_dir=DIR) and run.log(...) every epoch
--accumulate K    init(accumulate=K)
--peek            draws one batch with next(iter(loader)) before training
--world-batch G   per-process batch G // run.world_size (a global batch G)
--sched           a warmup scheduler stepped once per optimizer step (if run.step(opt))
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import splitsync

parser = argparse.ArgumentParser()
parser.add_argument("--reduction", default="mean")
parser.add_argument("--plain-loader", action="store_true")
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--batchnorm", action="store_true")
parser.add_argument("--no-set-epoch", action="store_true")
parser.add_argument("--world-seed", action="store_true")
parser.add_argument("--lr-by-world", action="store_true")
parser.add_argument("--ckpt", default=None)
parser.add_argument("--run-dir", default=None)
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--peek", action="store_true")
parser.add_argument("--world-batch", type=int, default=None)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--sum-micro", action="store_true")
parser.add_argument("--params-before", action="store_true")
parser.add_argument("--ckpt-no-opt", action="store_true")
parser.add_argument("--sched-micro", action="store_true")
parser.add_argument("--no-shuffle", action="store_true")
parser.add_argument("--sched", action="store_true")
args = parser.parse_args()

g = torch.Generator().manual_seed(0)
x = torch.randn(512, 10, generator=g)
y = (x[:, :4].sum(dim=1) > 0).long() + (x[:, 4] > 1).long()
data = TensorDataset(x, y)

with splitsync.init(seed=0, accumulate=args.accumulate, run_dir=args.run_dir) as run:
    if args.world_seed:
        torch.manual_seed(run.world_size)
    layers = [nn.Linear(10, 32)]
    if args.batchnorm:
        layers.append(nn.BatchNorm1d(32))
    layers += [nn.ReLU(), nn.Dropout(args.dropout), nn.Linear(32, 3)]
    net = nn.Sequential(*layers)
    params = list(net.parameters())
    model = run.model(net)
    lr = 0.05 * (run.world_size if args.lr_by_world else 1)
    opt = torch.optim.SGD(params if args.params_before else model.parameters(), lr=lr,
                          momentum=0.9)
    batch = 16 if args.world_batch is None else args.world_batch // run.world_size
    if args.plain_loader:
        loader = DataLoader(data, batch_size=batch, shuffle=True)
    else:
        loader = run.loader(data, batch_size=batch, shuffle=not args.no_shuffle)
    if args.sched or args.sched_micro:  # made only when asked: it scales lr at once
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    done = start = 0
    if args.ckpt:
        objects = {"model": model} if args.ckpt_no_opt else {"model": model, "optimizer": opt}
        state = run.resume(args.ckpt, **objects)
        done, start = state.step, state.epoch
    if args.peek:
        xb, _ = next(iter(loader))
        with torch.no_grad():
            run.print("input", tuple(xb.shape), "output", tuple(model(xb).shape))
    epochs = range(args.epochs) if args.no_set_epoch else run.epochs(args.epochs, start)
    for epoch in epochs:
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb, reduction=args.reduction)
            run.backward(loss * run.config.accumulate if args.sum_micro else loss)
            stepped = run.step(opt).stepped
            if args.sched_micro or (args.sched and stepped):
                warmup.step()
            if args.ckpt and run.sync_gradients:
                done += 1
                run.save(step=done) if args.ckpt_no_opt else run.save()
        if args.run_dir:
            run.log(epoch=epoch, loss=loss)
        run.print(f"epoch {epoch} loss {run.mean(loss):.4f}")
