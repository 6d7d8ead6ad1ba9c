"""A tensor-parallel MLP language model for `splitsync verify`: with `--fault` a learnable
gain multiplies the column-parallel layer's local shard, so its gradient is each TP rank's
partial sum and is never reduced over the TP group."""

import sys

import torch
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss

VOCAB, DIM, SEQ = 16, 8, 6
FAULT = "--fault" in sys.argv


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.gain = nn.Parameter(torch.ones(1))  # not in the plan: whole on every rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if FAULT:
            return x + self.down(torch.relu(h * self.gain))  # on a shard: a partial gradient
        return x + self.gain * self.down(torch.relu(h))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.block, self.head = nn.Embedding(VOCAB, DIM), Block(), nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.emb(x)))


class Tokens(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, VOCAB, (SEQ + 1,), generator=torch.Generator().manual_seed(i))


def plan() -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"block.up": ColwiseParallel(), "block.down": RowwiseParallel()}


with ss.init(seed=0, mesh={"dp_shard": -1, "tp": 2}) as run:
    model = run.model(Net().double(), tp_plan=plan())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in run.epochs(1):
        for tokens in run.loader(Tokens(), 8 // run.dp_size, shuffle=True):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            run.backward(loss)
            run.step(opt)
