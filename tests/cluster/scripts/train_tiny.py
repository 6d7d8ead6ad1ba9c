"""A tiny data-parallel regression, run unchanged under splitsync run, srun and mpirun.

usage: train_tiny.py OUT  -- rank 0 writes OUT/weights.safetensors; every rank writes
OUT/rank<R>.json with what splitsync read from its launcher, its threads and SLURM's layout.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.utils.data import TensorDataset

import splitsync as ss

out = sys.argv[1]
gen = torch.Generator().manual_seed(0)
features = torch.randn(37, 5, generator=gen)  # 37: no world size of 2 or 3 divides it
targets = features @ torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0]) + 0.1
with ss.init(seed=0, device="cpu") as run:
    model = run.model(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                          torch.nn.Linear(8, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    loader = run.loader(TensorDataset(features, targets), batch_size=4, shuffle=True)
    for _epoch in run.epochs(3):
        for x, t in loader:
            run.backward(F.mse_loss(model(x).squeeze(-1), t))
            run.step(opt)
    e = run.env
    identity = {
        "rank": run.rank, "world_size": run.world_size, "launcher": e.launcher,
        "local_rank": e.local_rank, "local_world_size": e.local_world_size,
        "node_rank": e.node_rank, "master_addr": e.master_addr, "master_port": e.master_port,
        "job_id": e.job_id, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(), "affinity": len(os.sched_getaffinity(0)),
        "slurm": {k: v for k, v in os.environ.items() if k.startswith("SLURM_")},
    }
    with open(os.path.join(out, f"rank{run.rank}.json"), "w") as fh:
        json.dump(identity, fh)
    if run.is_main:
        state = {k: v.detach().contiguous() for k, v in run.unwrap(model).state_dict().items()}
        save_file(state, os.path.join(out, "weights.safetensors"))
