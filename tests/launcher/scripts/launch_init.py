"""A script using splitsync.init(): each process writes OUT/rank_<rank> with its identity."""

import json
import os
import sys

import torch

import splitsync as ss

out = sys.argv[1]
with ss.init(seed=0, device="cpu") as run:
    total = run.sum(torch.tensor(1.0)).item()  # a real collective across all ranks
    with open(os.path.join(out, f"rank_{run.rank}"), "w") as fh:
        json.dump({"world_size": run.world_size, "launcher": run.env.launcher,
                   "local_rank": run.local_rank, "sum": total}, fh)
