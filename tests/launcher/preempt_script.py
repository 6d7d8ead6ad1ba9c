"""Training script for the preemption tests and ``benchmarks/preempt_trials.py``.

    preempt_script.py CKPT OUT [--strategy ddp|fsdp] [--accumulate K] [--background]
        [--epochs E] [--save-every N] [--eval-every N] [--eval-seconds S]
        [--step-seconds S] [--run-dir DIR] [--grace S] [--workers W [--persistent]]

A model with batch norm (LayerNorm under FSDP) and dropout, an LR scheduler stepped after ``run.step`` (so a stop
saved before the script's own work for a step would be found out), a shuffled loader over a
dataset the world size does not divide (its remainder dropped: a resumed pass pads
differently from an uninterrupted one, a separate bug), saves every N steps (in the background with
``--background``), an evaluation with a collective every N steps, and an export at the end.
Every rank prints ``pid <rank> <pid>`` first; rank 0 prints, flushed, ``resumed <step>``,
``step <n>`` after each optimizer step, ``save <n>`` / ``saved <n>`` around its saves,
``eval`` / ``evaluated`` around evaluations and ``done <n>`` at the end. The harness signals
on those lines. ``--crash-in-eval``: rank 1 raises at the first evaluation.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss


class Data(Dataset):
    def __init__(self, n: int, offset: int = 0) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(6, generator=torch.Generator().manual_seed(self.offset + i))
        return x, x.sum().unsqueeze(0)


def net(strategy: str) -> nn.Module:
    # FSDP2 keeps batch-norm statistics per rank and a checkpoint holds rank 0's, so a
    # resume changes the others' (a separate limitation): LayerNorm there
    norm = nn.LayerNorm(16) if strategy == "fsdp" else nn.BatchNorm1d(16)
    return nn.Sequential(nn.Linear(6, 16), norm, nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))


def say(run: ss.Run | None, text: str) -> None:
    """One line, in one write: the ranks share the launcher's stdout."""
    if run is None or run.is_main:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def evaluate(run: ss.Run, model: nn.Module, loader: object, seconds: float,
             crash: bool = False) -> None:
    say(run, "eval")
    if crash and run.rank == 1:
        raise RuntimeError("rank 1 crashes in the evaluation (--crash-in-eval)")
    model.eval()
    total = torch.zeros(())
    with torch.no_grad():
        for x, y in loader:  # type: ignore[attr-defined]
            total += F.mse_loss(model(x), y)
            time.sleep(seconds / 3)
    model.train()
    run.mean(total)  # a collective inside the evaluation
    say(run, "evaluated")


def main(a: argparse.Namespace) -> None:
    with ss.init(seed=0, deterministic=True, accumulate=a.accumulate, run_dir=a.run_dir,
                 ledger=a.run_dir is not None, preempt_grace=a.grace) as run:
        say(None, f"pid {run.rank} {os.getpid()}")
        model = run.model(net(a.strategy), strategy=a.strategy)
        opt = torch.optim.AdamW(model.parameters(), lr=0.02)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
        loader = run.loader(Data(53), batch_size=4, shuffle=True, drop_last=True,
                            num_workers=a.workers,
                            **({"persistent_workers": True} if a.persistent else {}))
        # evaluation batches of their own (a run.loader over them would count in the epoch
        # a checkpoint records)
        xs = torch.stack([Data(6, offset=1000)[i][0] for i in range(6)])
        evals = [run.to_device((x, x.sum(1, keepdim=True))) for x in xs.split(2)]
        state = run.resume(a.ckpt, model=model, optimizer=opt, scheduler=sched,
                           save_blocking=not a.background)
        step = state.step
        say(run, f"resumed {step}")
        for _ in run.epochs(a.epochs, start=state.epoch):
            for x, y in loader:
                run.backward(F.mse_loss(model(x), y))
                run.step(opt)
                if not run.sync_gradients:
                    continue  # a micro-step of the accumulation window
                sched.step()
                step += 1
                say(run, f"step {step}")
                time.sleep(a.step_seconds)
                if step % a.save_every == 0:
                    say(run, f"save {step}")
                    run.save()
                    say(run, f"saved {step}")
                if a.eval_every and step % a.eval_every == 0:
                    evaluate(run, model, evals, a.eval_seconds, a.crash_in_eval)
        run.save()  # the end (a background one commits at close)
        run.export(a.out)
        say(run, f"done {step}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("ckpt")
    p.add_argument("out")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--background", action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--eval-seconds", type=float, default=0.3)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--run-dir", default=None)
    p.add_argument("--grace", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=0, help="the loader's num_workers")
    p.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    p.add_argument("--crash-in-eval", action="store_true", help="rank 1 raises there")
    return p.parse_args(argv)


if __name__ == "__main__":
    main(parse())
