"""Example 3 with splitsync: the same DDP training, and it also runs as one plain process.

    splitsync run -n 2 examples/lesson/example3_ddp_splitsync.py
    python examples/lesson/example3_ddp_splitsync.py

``init`` forms the process group (backend from the device), seeds every rank alike;
``run.model`` wraps in DDP; ``run.loader`` gives each rank its shard; ``run.epochs`` calls
``set_epoch``; leaving the ``with`` block destroys the group.
"""

from __future__ import annotations

import torch
from simplenet import SimpleNet, toy_data
from torch import nn, optim
from torch.utils.data import TensorDataset

import splitsync as ss
from splitsync import gather_object


def main(epochs: int = 5) -> None:
    with ss.init(seed=42) as run:
        model = run.model(SimpleNet())
        optimizer = optim.SGD(model.parameters(), lr=0.5)
        criterion = nn.CrossEntropyLoss()
        x, y = toy_data(256)
        loader = run.loader(TensorDataset(x, y, torch.arange(len(y))), batch_size=16,
                            shuffle=True)

        seen: set[int] = set()
        for epoch in run.epochs(epochs):
            for xb, yb, idx in loader:
                loss = criterion(model(xb), yb)
                run.backward(loss)
                run.step(optimizer)
                if epoch == 0:
                    seen.update(idx.tolist())
            run.log(epoch=epoch, loss=loss)      # averaged over ranks, printed once

        shards = gather_object(seen)             # every rank's set, in rank order
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        same = torch.equal(flat, run.broadcast(flat))
        sizes = [len(s) for s in shards]
        union = set().union(*shards)
        run.print(f"epoch 0 shard sizes: {sizes}, union covers {len(union)}/{len(y)}, "
                  f"overlap {sum(sizes) - len(union)}")
        print(f"rank {run.rank}: weights identical to rank 0: {same}", flush=True)


if __name__ == "__main__":
    main()
