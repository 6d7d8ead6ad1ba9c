"""Training script for the background-save crash test: like ckpt_crash_script, saving in the
background every 2 steps, under the strategy SPLITSYNC_TEST_STRATEGY (default ddp).
SPLITSYNC_TEST_KILL="<rank>:<point>[,<rank>:<point>...]": attempt k (restart count k) makes
the k-th rank named SIGKILL itself inside the save of step 6, at point staging, writing or
commit; later attempts run clean. The hook is installed by patching from here: the library
has no such switch.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import torch
import torch.nn.functional as F
from ckpt_crash_script import Data
from torch import nn

import splitsync as ss
from splitsync.ckpt import save as background
from splitsync.ckpt import staging


def die(*_: Any, **__: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, rank: int) -> None:
    if point == "staging":  # while copying the state to host memory
        staging.Stager.stage = die  # type: ignore[method-assign]
    elif point == "writing":  # in the background thread, with a part half written
        real = background.write_object

        def half(create: Any, durable: Any, obj: Any) -> Any:
            with create() as f:
                f.write(b"\0" * 64)
                durable(f)
            die()
            return real(create, durable, obj)

        background.write_object = half
    elif point == "commit":  # rank 0: before the manifest; rank 1: at the commit handshake
        if rank == 0:
            background.manifest_text = die
        else:
            background.broadcast = die
    else:
        raise ValueError(point)


def main(ckpt: str, out: str, strategy: str = "ddp", kills: str = "") -> None:
    with ss.init(seed=0, deterministic=True) as run:
        net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        model = run.model(net, strategy=strategy)
        attempt = run.env.restart_count
        todo = [k for k in kills.split(",") if k]
        kill = todo[attempt] if attempt < len(todo) else ""
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        loader = run.loader(Data(30), batch_size=4, shuffle=True)
        state = run.resume(ckpt, model=model, optimizer=opt, save_blocking=False)
        step, handle = state.step, None
        for _ in run.epochs(3, start=state.epoch):
            for x, y in loader:
                run.backward(F.mse_loss(model(x), y))
                run.step(opt)
                step += 1
                if step % 2 == 0:
                    if kill and step == 6:
                        if handle is not None:
                            handle.wait()  # the save of step 4 completes untouched
                        who, point = kill.split(":")
                        if int(who) == run.rank:
                            arm(point, run.rank)
                    handle = run.save(ckpt)
        run.export(out)
        run.print(f"restart {run.env.restart_count}: resumed at step {state.step}, ended at {step}")


def spawn_entry(rank: int, world: int, ckpt: str, out: str, strategy: str) -> None:
    main(ckpt, out, strategy)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], os.environ.get("SPLITSYNC_TEST_STRATEGY", "ddp"),
         os.environ.get("SPLITSYNC_TEST_KILL", ""))
