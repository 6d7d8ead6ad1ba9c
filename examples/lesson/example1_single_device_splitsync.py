"""Example 1 with splitsync: the same loop; it also runs unchanged on N processes.

    python examples/lesson/example1_single_device_splitsync.py
    splitsync run -n 2 examples/lesson/example1_single_device_splitsync.py
"""

from __future__ import annotations

import torch
from simplenet import SimpleNet, toy_data
from torch import nn, optim

import splitsync as ss


def main(steps: int = 50) -> tuple[float, float]:
    with ss.init(seed=0) as run:              # device, process group (if launched), seeds
        run.print(f"device: {run.device}, processes: {run.world_size}")
        model = run.model(SimpleNet())        # moved to the device; DDP-wrapped when N > 1
        x, y = toy_data(64)
        # Full batch: each rank gets its 64 / N rows, so N processes see the whole data once.
        loader = run.loader(torch.utils.data.TensorDataset(x, y), batch_size=64 // run.world_size)
        criterion = nn.CrossEntropyLoss()
        optimizer = optim.SGD(model.parameters(), lr=0.5)

        losses = []
        for _ in range(steps):
            for xb, yb in loader:             # batches arrive on the device
                loss = criterion(model(xb), yb)
                run.backward(loss)
                run.step(optimizer)           # step, then zero the gradients
            losses.append(run.mean(loss.item()))  # averaged over ranks
        run.print(f"loss: first {losses[0]:.4f} -> last {losses[-1]:.4f}")
        return losses[0], losses[-1]


if __name__ == "__main__":
    main()
