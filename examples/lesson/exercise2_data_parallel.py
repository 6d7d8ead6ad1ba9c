"""Exercise 2 (and example 2): DataParallel on a batch of 8. Does the output shape change?

    python examples/lesson/exercise2_data_parallel.py

No. DataParallel splits the input along dim 0 (the batch): with 2 GPUs each replica gets a
(4, 10) slice and returns (4, 2); the slices are concatenated again along dim 0 on GPU 0, so
the output is (8, 2) -- the same as on one device. Only the batch dimension is split, which is
also why an input without a batch dimension must be given one before DataParallel.

With fewer than 2 GPUs this script says so, runs on one device, and shows the same split and
merge by hand on that device.
"""

from __future__ import annotations

import torch
from simplenet import SimpleNet
from torch import nn, optim


def main(batch: int = 8) -> tuple[int, ...]:
    torch.manual_seed(0)
    num_gpus = torch.cuda.device_count()
    print(f"GPUs found: {num_gpus}")
    model: nn.Module = SimpleNet()
    if num_gpus >= 2:
        device = torch.device("cuda", 0)      # DataParallel's inputs and outputs live on GPU 0
        model = nn.DataParallel(model.to(device))  # splitsync: ignore[SS201] (the lesson)
        print(f"DataParallel over {num_gpus} GPUs")
    else:
        # The lesson wraps and moves to cuda:0 unconditionally, which fails without a GPU.
        device = torch.device("cuda", 0) if num_gpus == 1 else torch.device("cpu")
        model = model.to(device)
        print(f"fewer than 2 GPUs: DataParallel needs at least 2, running on {device}")

    x = torch.randn(batch, 10, device=device)
    labels = torch.randint(0, 2, (batch,), device=device)
    out = model(x)
    print(f"input shape: {tuple(x.shape)} -> output shape: {tuple(out.shape)}")

    if num_gpus < 2:
        # What DataParallel does with 2 GPUs, done by hand: scatter dim 0, run, gather dim 0.
        halves = x.chunk(2, dim=0)
        parts = [model(h) for h in halves]
        merged = torch.cat(parts, dim=0)
        print(f"split by hand: {[tuple(h.shape) for h in halves]} -> "
              f"{[tuple(p.shape) for p in parts]} -> merged {tuple(merged.shape)}; "
              f"same as one pass: {torch.allclose(merged, out, atol=1e-6)}")

    # Example 2's training step: the loop is unchanged, DataParallel sums the replicas'
    # gradients into the module on GPU 0.
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    optimizer.zero_grad()
    loss = nn.CrossEntropyLoss()(out, labels)
    loss.backward()
    optimizer.step()
    print(f"one training step done, loss {loss.item():.4f}")
    return tuple(out.shape)


if __name__ == "__main__":
    main()
