"""One script at every world size: DDP's options given to run.model under strategy "auto".

The model has a branch the loss never uses, so at 2 processes DDP needs
find_unused_parameters=True; at 1 process (a plain module) the option is ignored.
"""

import torch
from torch import nn

import splitsync


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 1)
        self.unused = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


with splitsync.init(seed=0) as run:
    model = run.model(Net(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = run.loader(torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1)),
                        batch_size=4, shuffle=True)
    for _ in run.epochs(2):
        for xb, yb in loader:
            run.backward(nn.functional.mse_loss(model(xb), yb))
            run.step(opt)
    print(f"trained rank={run.rank} world={run.world_size} "
          f"strategy={run.strategy_of(model).name}", flush=True)
