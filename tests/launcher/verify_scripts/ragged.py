"""A tiny language model on ragged, padded sequences: the loss is the usual masked mean over
each micro-batch's real tokens.

Without flags it hands that mean to ``run.backward(loss)``: at N processes the ranks' means
are averaged with equal weights (the mean of means), so ``splitsync verify`` finds the steps
differ from one process and names the cause. ``--count`` gives ``count=`` and must pass.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import splitsync

parser = argparse.ArgumentParser()
parser.add_argument("--count", action="store_true")
args = parser.parse_args()

VOCAB, SEQ = 17, 12
g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, VOCAB, (256, SEQ + 1), generator=g)
lengths = torch.randint(0, SEQ + 1, (256,), generator=g) * (torch.rand(256, generator=g) > 0.3)
mask = (torch.arange(SEQ)[None] < lengths[:, None]).float()
data = TensorDataset(tokens, mask)

with splitsync.init(seed=0) as run:
    torch.manual_seed(0)
    model = run.model(nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = run.loader(data, batch_size=8, shuffle=True)
    for _epoch in run.epochs(2):
        for x, m in loader:
            logits = model(x[:, :-1])
            per_token = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
            loss = (per_token * m).sum() / m.sum().clamp(min=1)
            if args.count:
                run.backward(loss, count=m.sum())
            else:
                run.backward(loss)
            run.step(opt)
