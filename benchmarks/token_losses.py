"""The mean of means against the mean over all tokens, measured: docs/token-losses.md's table.

A small language model (embedding, two residual blocks, a head) trains in float64 on ragged
sequences: every micro-batch's loss is the usual masked mean over its real tokens. Each
layout (processes x micro-batches, DDP on gloo) runs one SGD step at lr 1 and, separately,
3 AdamW steps, with ``run.backward(loss)`` (the mean of the micro-batches' means) and with
``run.backward(loss, count=n)``; the table gives the largest weight difference from one
process on the whole batch (the mean over every real token).

    PYTHONPATH=src python benchmarks/token_losses.py [--seed 0]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from splitsync.testing import spawn

VOCAB, DIM, SEQ, BATCH = 50, 16, 32, 8
LAYOUTS = ((1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, DIM), Block(), Block(),
                         nn.Linear(DIM, VOCAB)).double()


def batch(step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged sequences, right-padded: lengths from 1 to SEQ real tokens."""
    g = torch.Generator().manual_seed(1000 * seed + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    lengths = torch.randint(1, SEQ + 1, (BATCH,), generator=g)
    return tokens, (torch.arange(SEQ)[None] < lengths[:, None]).double()


def masked_mean(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_token = F.cross_entropy(model(tokens[:, :-1]).transpose(1, 2), tokens[:, 1:],
                                reduction="none")
    return (per_token * mask).sum() / mask.sum()


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=1.0) if kind == "sgd" else torch.optim.AdamW(params, lr=0.01)


STEPS = {"sgd": 1, "adamw": 3}


def reference(kind: str, seed: int) -> torch.Tensor:
    model = net()
    opt = optimizer(kind, model.parameters())
    for s in range(STEPS[kind]):
        masked_mean(model, *batch(s, seed)).backward()
        opt.step()
        opt.zero_grad()
    return flat(model)


def _layout(rank: int, world: int, micro: int, seed: int) -> dict[str, torch.Tensor]:
    import torch.distributed as dist

    import splitsync as ss

    if world > 1:  # one group for every run below (each ss.init finds it and leaves it up)
        dist.init_process_group("gloo")
    out = {}
    for kind in STEPS:
        for count in (False, True):
            with ss.init(seed=0, accumulate=micro) as run:
                model = run.model(net())
                opt = optimizer(kind, model.parameters())
                size = BATCH // world // micro
                for s in range(STEPS[kind]):
                    tokens, mask = batch(s, seed)
                    for m in range(micro):
                        at = (m * world + rank) * size
                        loss = masked_mean(model, tokens[at:at + size], mask[at:at + size])
                        if count:
                            run.backward(loss, count=int(mask[at:at + size].sum()))
                        else:
                            run.backward(loss)
                        run.step(opt)
                out[f"{kind} {'count' if count else 'mean of means'}"] = flat(run.unwrap(model))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    refs = {kind: reference(kind, args.seed) for kind in STEPS}
    print("| world size x micro-batches | SGD lr 1, 1 step: mean of means | with count= "
          "| AdamW, 3 steps: mean of means | with count= |")
    print("|---|---|---|---|---|")
    for world, micro in LAYOUTS:
        if world == 1:
            res = _layout(0, 1, micro, args.seed)
        else:
            res = spawn(_layout, world, micro, args.seed, timeout=600)[0]
        cells = [f"{(res[f'{k} {c}'] - refs[k]).abs().max().item():.1e}"
                 for k in STEPS for c in ("mean of means", "count")]
        print(f"| {world} x {micro} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
