"""A small port of a typical image-classification script, for the acceptance test.

    port_script.py CKPT OUT RUN_DIR [--epochs E] [--kill-after K] [--step-seconds S]

What such scripts do: mixup or cutmix chosen per batch with Python's ``random`` (as
torchvision's ``RandomChoice``), a permutation and label smoothing from torch's generator,
a model with BatchNorm under DDP, an EMA of it (BatchNorm buffers included), a loader with
2 workers under ``run.progress``, and after every epoch two evaluation passes over one
evaluation loader (the model, then the EMA). Saves every 3 steps and at each epoch's end.
Rank 0 prints ``resumed <step>`` and ``step <n>`` (flushed); ``--kill-after K``: rank 1
SIGKILLs itself after step K of the first attempt. At the end the model is exported to OUT
and every rank writes its EMA's whole state (weights and buffers) to OUT.ema-rank<r>.
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import signal
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss

#: issue 45 part B: evaluation loaders (``run.loader(..., train=False)``), per-rank EMA
#: buffers; detected by run.ema's new keywords, which came with them
PART_B = "every" in inspect.signature(ss.Run.ema).parameters


class Images(Dataset):
    def __init__(self, n: int, offset: int = 0) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.offset + i)
        return torch.randn(3, 8, 8, generator=g), int(torch.randint(4, (), generator=g))


def net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4))


def mix(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup or cutmix, chosen with Python's random; soft, smoothed targets."""
    target = F.one_hot(y, 4).float() * 0.9 + 0.1 / 4  # label smoothing
    perm = torch.randperm(x.shape[0])
    lam = random.betavariate(1.0, 1.0)
    if random.random() < 0.5:  # mixup
        x = lam * x + (1 - lam) * x[perm]
    else:  # cutmix: a box of the other image
        h = int(8 * (1 - lam) ** 0.5)
        top, left = random.randint(0, 8 - h), random.randint(0, 8 - h)
        x = x.clone()
        x[:, :, top:top + h, left:left + h] = x[perm][:, :, top:top + h, left:left + h]
        lam = 1 - h * h / 64
    return x, lam * target + (1 - lam) * target[perm]


def evaluate(run: ss.Run, model: nn.Module, loader: object) -> float:
    model.eval()
    correct = torch.zeros(())
    with torch.no_grad():
        for x, y in loader:  # type: ignore[attr-defined]
            correct += (model(x).argmax(1) == y).sum()
    model.train()
    return float(run.mean(correct))


def main(a: argparse.Namespace) -> None:
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    with ss.init(seed=5, deterministic=True, run_dir=a.run_dir, ledger=True) as run:
        model = run.model(net())
        ema = run.ema(model, decay=0.8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs * 8)
        train = run.loader(Images(64), batch_size=4, shuffle=True, num_workers=2,
                           multiprocessing_context="fork")
        evaluation = run.loader(Images(16, offset=1000), batch_size=4,
                                **({"train": False} if PART_B else {}))
        state = run.resume(a.ckpt, model=model, optimizer=opt, scheduler=sched)
        step = state.step
        run.print(f"resumed {step}", flush=True)
        for epoch in run.epochs(a.epochs, start=state.epoch):
            for x, y in run.progress(train, desc=f"epoch {epoch}"):
                x, target = mix(x, y)
                loss = torch.sum(-target * F.log_softmax(model(x), 1), 1).mean()
                run.backward(loss)
                run.step(opt)
                sched.step()
                step += 1
                run.print(f"step {step}", flush=True)
                time.sleep(a.step_seconds)
                if first_attempt and step == a.kill_after and run.rank == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step % 3 == 0:
                    run.save()
            accuracy = evaluate(run, model, evaluation), evaluate(run, ema, evaluation)
            run.log(model_accuracy=accuracy[0], ema_accuracy=accuracy[1])
            run.save()
        run.export(a.out)
        buffers = {k: v.detach().clone().contiguous()
                   for k, v in run.unwrap(ema).state_dict().items()}
        save_file(buffers, f"{a.out}.ema-rank{run.rank}")
        run.print(f"done {step}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("ckpt")
    p.add_argument("out")
    p.add_argument("run_dir")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--kill-after", type=int, default=-1)
    p.add_argument("--step-seconds", type=float, default=0.0)
    main(p.parse_args(sys.argv[1:]))
