"""Training script for the RNG guard: every global generator at each step's start.

    rng_script.py CKPT OUT --steps N [--stop-after K]

Each step starts with a batch from ``run.progress(loader)``; the script records, per rank,
a digest of Python's ``random``, NumPy's, torch's CPU (and CUDA, when present) generator
states there, then draws from all of them (a mixup-or-cutmix choice, a NumPy mix weight,
dropout), and calls ``run.print`` and ``run.log`` (trackers under a run_dir). Before each
epoch it calls a helper imported on first use that draws at import (as rich does): after
a resume, between ``run.resume`` and the first step. ``--stop-after K``: save step K and
exit there (the process "dies"). OUT-rank<r>.json gets {step: digest}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss


class Data(Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(6, generator=torch.Generator().manual_seed(i))
        return x, x.sum().unsqueeze(0)


def digest() -> str:
    h = hashlib.sha256(repr(random.getstate()).encode())
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    h.update(keys.tobytes() + repr((kind, pos, has_gauss, gauss)).encode())
    h.update(torch.get_rng_state().numpy().tobytes())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for state in torch.cuda.get_rng_state_all():
            h.update(state.numpy().tobytes())
    return h.hexdigest()


def warm_up() -> None:
    import draws_at_import  # noqa: F401  (first use: it draws at import)


def main(a: argparse.Namespace) -> None:
    with ss.init(seed=3, deterministic=True, run_dir=a.ckpt + "-run") as run:
        model = run.model(nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = run.loader(Data(), batch_size=2, shuffle=True)
        state = run.resume(a.ckpt, model=model, optimizer=opt)
        seen, step = {}, state.step
        for _ in run.epochs(1000, start=state.epoch):
            warm_up()
            for x, y in run.progress(loader, desc="train"):
                seen[step + 1] = digest()
                if random.random() < 0.5:  # mixup or cutmix, as torchvision's RandomChoice
                    x = x * float(np.random.beta(1.0, 1.0))
                loss = F.mse_loss(model(x), y)
                run.backward(loss)
                run.step(opt)
                step += 1
                run.print(f"step {step}")
                run.log(loss=loss)
                if step == a.stop_after:
                    run.save()
                    break
                if step == a.steps:
                    break
            if step in (a.steps, a.stop_after):
                break
    Path(f"{a.out}-rank{run.rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("ckpt")
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--stop-after", type=int, default=-1)
    main(p.parse_args(sys.argv[1:]))
