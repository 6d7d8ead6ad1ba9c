"""Example 3, fixed: DistributedDataParallel launched by torchrun, in plain PyTorch.

    torchrun --standalone --nproc-per-node 2 examples/lesson/example3_ddp_torchrun.py

What the lesson's version got wrong, and the fix here:
- ``train()`` was never called: ``main`` calls it with the rank torchrun assigns.
- every rank trained on the same data: a DistributedSampler gives each rank its own shard,
  and ``set_epoch`` reshuffles it every epoch.
- seeds were not synchronised: every rank seeds the same value before building the model
  (DDP also broadcasts rank 0's weights when it wraps the model).
- NCCL and ``cuda`` were hard-coded: gloo and the CPU are used when there is no GPU.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from simplenet import SimpleNet, toy_data
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(rank: int, world_size: int, local_rank: int, epochs: int = 5) -> None:
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # torchrun exports MASTER_ADDR/PORT, RANK and WORLD_SIZE; the group reads them.
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        torch.manual_seed(42)                        # same seed on every rank
        model = DDP(SimpleNet().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
        optimizer = optim.SGD(model.parameters(), lr=0.5)
        criterion = nn.CrossEntropyLoss()

        x, y = toy_data(256)
        dataset = TensorDataset(x, y, torch.arange(len(y)))
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                     seed=42)
        loader = DataLoader(dataset, batch_size=16, sampler=sampler)

        seen: set[int] = set()
        for epoch in range(epochs):
            sampler.set_epoch(epoch)                 # a new shuffle each epoch
            for xb, yb, idx in loader:
                xb, yb = xb.to(device), yb.to(device)
                optimizer.zero_grad()
                loss = criterion(model(xb), yb)
                loss.backward()                      # gradients all-reduced here
                optimizer.step()
                if epoch == 0:
                    seen.update(idx.tolist())
            print(f"rank {rank}, epoch {epoch}, loss {loss.item():.4f}", flush=True)

        # Each rank read its own shard: the shards are disjoint and cover the dataset.
        shards: list[set[int] | None] = [None] * world_size
        dist.all_gather_object(shards, seen)
        # The replicas stayed identical: every rank holds the same weights.
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        if rank == 0:
            sizes = [len(s) for s in shards]  # type: ignore[arg-type]
            union = set().union(*shards)  # type: ignore[arg-type]
            print(f"epoch 0 shard sizes: {sizes}, union covers {len(union)}/{len(dataset)}, "
                  f"overlap {sum(sizes) - len(union)}", flush=True)
        same = torch.equal(flat, ref)
        print(f"rank {rank}: weights identical to rank 0: {same}", flush=True)
    finally:
        dist.destroy_process_group()


def main() -> None:
    if "RANK" not in os.environ:
        raise SystemExit("Launch with: torchrun --standalone --nproc-per-node 2 "
                         "examples/lesson/example3_ddp_torchrun.py")
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))


if __name__ == "__main__":
    main()  # the lesson only printed a hint here; train() never ran
