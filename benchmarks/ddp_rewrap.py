"""Plain PyTorch: does a DDP wrapper made afresh at step k train like one never re-wrapped?

Each rank trains ``STEPS`` steps in one ``DistributedDataParallel`` wrapper, then the same
steps with a new wrapper from step ``K`` on (model and optimizer state copied over, as a
resumed run loads them), and prints the largest difference of the final weights. Variants:

* ``plain``: ``DistributedDataParallel`` as is. The new wrapper's first step all-reduces
  with DDP's initial bucket layout (one bucket, definition order), the old wrapper's with
  the layout rebuilt after its own first step (gradient-arrival order): at 3 or more gloo
  ranks the sums come out in another order, so other bits.
* ``static``: ``static_graph=True``: it rebuilds after the first step too; no help.
* ``splitsync``: ``splitsync.strategies.ddp`` (its ``DistributedDataParallel`` + ``fix_bucket_layout``):
  the layout is rebuilt before the first step, from the reverse definition order.

    OMP_NUM_THREADS=1 python benchmarks/ddp_rewrap.py      # worlds 2, 3, 4; all variants

Figures (torch 2.13 CPU, gloo): plain 0 at 2 ranks, 2.98e-08 at 3, 4.47e-08 at 4; static
5.96e-08 at 3 and 4; splitsync 0 at 2, 3 and 4.
"""

from __future__ import annotations

import copy
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from splitsync.strategies import ddp

STEPS, K = 12, 7


def make() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 1))


def wrap(module: nn.Module, variant: str) -> nn.Module:
    if variant == "splitsync":
        model = ddp.DistributedDataParallel(module, gradient_as_bucket_view=True)
        ddp.fix_bucket_layout(model)
        return model
    return DistributedDataParallel(module, gradient_as_bucket_view=True,
                                   static_graph=variant == "static")


def train(model: nn.Module, opt: torch.optim.Optimizer, lo: int, hi: int, rank: int) -> None:
    for step in range(lo, hi):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 6, generator=g)
        F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def rank_main(rank: int, world: int, port: int, variant: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = wrap(make(), variant)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, 0, STEPS, rank)
    whole = [p.detach().clone() for p in model.parameters()]
    model = wrap(make(), variant)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, 0, K, rank)
    saved = copy.deepcopy((model.module.state_dict(), opt.state_dict()))
    fresh = make()
    fresh.load_state_dict(saved[0])
    model = wrap(fresh, variant)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(saved[1])
    train(model, opt, K, STEPS, rank)
    diff = max((a - b).abs().max().item() for a, b in zip(whole, model.parameters(), strict=True))
    if rank == 0:
        print(f"world {world} {variant:9s}: largest difference {diff:.3g}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    worlds = [int(a) for a in sys.argv[1:]] or [2, 3, 4]
    for world in worlds:
        for variant in ("plain", "static", "splitsync"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(rank_main, args=(world, port, variant), nprocs=world)


if __name__ == "__main__":
    main()
