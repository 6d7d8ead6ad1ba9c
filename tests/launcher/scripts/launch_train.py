"""A tiny data-parallel regression used by the launcher tests.

usage: launch_train.py OUT_DIR  -- writes rank_<RANK> files and, on rank 0, params.pt
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import splitsync as ss

out = sys.argv[1]
gen = torch.Generator().manual_seed(0)
features = torch.randn(64, 4, generator=gen)
targets = features @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
with ss.init(seed=0, device="cpu") as run:
    model = run.model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = run.loader(TensorDataset(features, targets), batch_size=8, shuffle=True)
    for _epoch in run.epochs(2):
        for x, t in loader:
            run.backward(F.mse_loss(model(x).squeeze(-1), t))
            run.step(opt)
    with open(os.path.join(out, f"rank_{run.rank}"), "w") as fh:
        fh.write(f"{run.world_size} {run.env.launcher}\n")
    if run.is_main:
        state = {k: v.detach().clone() for k, v in run.unwrap(model).state_dict().items()}
        torch.save({"world_size": run.world_size, "state": state}, os.path.join(out, "params.pt"))
