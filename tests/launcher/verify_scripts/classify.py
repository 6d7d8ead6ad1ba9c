"""A small data-parallel training script, correct by default; flags break it on purpose.

--reduction sum   loss summed over the batch instead of averaged
--plain-loader    a plain DataLoader: every rank reads all the data (no sampler)
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
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

g = torch.Generator().manual_seed(0)
x = torch.randn(512, 10, generator=g)
y = (x[:, :4].sum(dim=1) > 0).long() + (x[:, 4] > 1).long()
data = TensorDataset(x, y)

with splitsync.init(seed=0) as run:
    model = run.model(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if args.plain_loader:
        loader = DataLoader(data, batch_size=16, shuffle=True)
    else:
        loader = run.loader(data, batch_size=16, shuffle=True)
    for epoch in run.epochs(args.epochs):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb, reduction=args.reduction)
            run.backward(loss)
            run.step(opt)
        run.print(f"epoch {epoch} loss {run.mean(loss):.4f}")
