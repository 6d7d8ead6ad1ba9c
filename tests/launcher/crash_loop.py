"""The training loop the crash scripts share: resume, save every 3 steps, export at the end.

With ``ema``, the EMA is exported too (to ``out + ".ema"``). With ``crash_at``, rank 1 kills itself with SIGKILL at that step on the first attempt only.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch.nn.functional as F
from torch import nn


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))


def train(run: Any, model: nn.Module, opt: Any, loader: Any, ckpt: str, out: str,
          crash_at: int | None, ema: nn.Module | None = None) -> None:
    # run.resume registers the EMA (made by run.ema before it) with no argument of its own
    state = run.resume(ckpt, model=model, optimizer=opt)
    step = state.step
    for _ in run.epochs(3, start=state.epoch):
        for x, y in loader:
            run.backward(F.mse_loss(model(x), y))
            run.step(opt)
            step += 1
            if step == crash_at and run.rank == 1 and run.env.restart_count == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % 3 == 0:
                run.save(ckpt)
    run.export(out)
    if ema is not None:
        run.export(f"{out}.ema", model=ema)
    run.print(f"restart {run.env.restart_count}: resumed at step {state.step}, ended at {step}")
