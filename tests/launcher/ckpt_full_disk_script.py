"""Full-disk scenario, run by test_ckpt_full_disk inside its own mount namespace on a 20 MB
tmpfs at ``argv[1]``: for ddp and fsdp, 2 ranks save once (fits), then once more (does not
fit), blocking and in the background. Prints one JSON line per strategy (rank 0's and rank
1's findings)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import splitsync as ss
from splitsync.testing import spawn


def _build(run: ss.Run, strategy: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # 2 x (1024 x 512 + ...) ~ 1M parameters: ~12.6 MB with AdamW
    model = run.model(nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512)),
                      strategy=strategy)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _step(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(run.rank))
    run.backward(F.mse_loss(model(x), x))
    run.step(opt)


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().clone() for k, v in sd.items()}


def _one(root: Path, strategy: str, blocking: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with ss.init(seed=0) as run:
        model, opt = _build(run, strategy)
        run.resume(root, model=model, optimizer=opt)
        _step(run, model, opt)
        run.save(blocking=True)  # step 1: fits
        saved = _full(model)
        _step(run, model, opt)
        try:
            h = run.save(blocking=blocking)  # step 2: does not fit
            if not blocking:
                while not h.done():
                    time.sleep(0.05)
                _step(run, model, opt)  # the failure surfaces after the next step
            out["error"] = None
        except Exception as e:  # noqa: BLE001 - the test checks what it is
            out["error"] = (type(e).__name__, isinstance(e, ss.CheckpointError), str(e))
        dist.barrier()
        out["left"] = sorted(p.name for p in root.iterdir())
    with ss.init(seed=0) as run:
        model, opt = _build(run, strategy)
        out["resumed"] = run.resume(root, model=model, optimizer=opt).step
        now = _full(model)
        out["same"] = all(torch.equal(now[k], saved[k]) for k in saved)
    return out


def scenario(rank: int, world: int, root: str, strategy: str) -> dict[str, Any]:
    holder = ss.init(seed=0)
    try:
        res = {}
        for blocking in (True, False):
            d = Path(root) / f"{strategy}-{'blocking' if blocking else 'background'}"
            res["blocking" if blocking else "background"] = _one(d, strategy, blocking)
            gc.collect()  # resumed optimizer state may still map the files (torch.load mmap)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(d)  # room for the next case
            dist.barrier()
        return res
    finally:
        holder.close()


if __name__ == "__main__":
    total, _, free = shutil.disk_usage(sys.argv[1])
    print(json.dumps({"fs_total": total, "pid": os.getpid()}))
    for strategy in ("ddp", "fsdp"):
        got = spawn(scenario, 2, sys.argv[1], strategy, timeout=180)
        print(json.dumps({"strategy": strategy, "ranks": got}))
