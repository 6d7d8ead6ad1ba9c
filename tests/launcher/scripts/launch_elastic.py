"""Elastic training used by the launcher test: checkpoints every step, resumes after restarts.

usage: launch_elastic.py OUT STEPS. Rank 0 writes OUT/ckpt.pt atomically after every step
(temporary file + os.replace); each worker appends "restart world rank step" lines to
OUT/progress and records its pid in OUT/pid_<NODE_TAG>_<LOCAL_RANK>; rank 0 writes
OUT/final.pt at the end.
"""

import os
import sys
import time

import torch
import torch.nn.functional as F

import splitsync as ss

out, total = sys.argv[1], int(sys.argv[2])
ckpt = os.path.join(out, "ckpt.pt")
tag = os.environ.get("NODE_TAG", "x")
with open(os.path.join(out, f"pid_{tag}_{os.environ.get('LOCAL_RANK', '0')}"), "w") as fh:
    fh.write(str(os.getpid()))

with ss.init(seed=0, device="cpu", timeout=60) as run:
    model = run.model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=True)
        run.unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0])
    for step in range(start, total):
        gen = torch.Generator().manual_seed(1000 * step + run.rank)
        x = torch.randn(8, 4, generator=gen)
        run.backward(F.mse_loss(model(x).squeeze(-1), x @ weights))
        run.step(opt)
        if run.is_main:
            tmp = ckpt + ".tmp"
            torch.save({"step": step + 1, "model": run.unwrap(model).state_dict(),
                        "opt": opt.state_dict(), "world_size": run.world_size}, tmp)
            os.replace(tmp, ckpt)
        with open(os.path.join(out, "progress"), "a") as fh:
            fh.write(f"{run.env.restart_count} {run.world_size} {run.rank} {step + 1}\n")
        time.sleep(0.2)  # leave the test time to take a node away mid-run
    if run.is_main:
        torch.save({"steps": total, "world_size": run.world_size, "resumed_from": start,
                    "restart_count": run.env.restart_count,
                    "model": run.unwrap(model).state_dict()}, os.path.join(out, "final.pt"))
