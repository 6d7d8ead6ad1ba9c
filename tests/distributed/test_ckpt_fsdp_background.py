"""FSDP2 background saves on gloo ranks: an uninterrupted run saving every 2 steps trains to
the end, a resume from its checkpoint is bit-equal, and the sharded background checkpoint
resumes at 1 rank (unsharded) and at 3 ranks (resharded)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import splitsync as ss
from splitsync.testing import spawn


def _build(run: ss.Run, strategy: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = run.model(nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                                    nn.Linear(32, 1)), strategy=strategy)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _full(model: nn.Module) -> dict[str, np.ndarray]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().numpy().copy() for k, v in sd.items()}


def _step(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer, i: int) -> float:
    g = torch.Generator().manual_seed(100 * i + run.rank)
    x = torch.randn(8, 6, generator=g)
    run.backward(F.mse_loss(model(x), x.sum(1, keepdim=True)))
    run.step(opt)
    return float(run.mean(torch.tensor(0.0)))  # a collective of the loop during the write


def two_ranks(rank: int, world: int, root: str) -> dict[str, Any]:
    holder = ss.init(seed=0)  # one process group across the simulated restart
    try:
        out: dict[str, Any] = {}
        with ss.init(seed=0, save_blocking=False) as run:
            model, opt = _build(run, "fsdp")
            run.resume(root, keep=2, model=model, optimizer=opt)
            handles = []
            for i in range(1, 7):
                _step(run, model, opt, i)
                if i % 2 == 0:
                    handles.append(run.save())  # background: returns once staged
                if i == 4:
                    out["at4"] = _full(model)
            out["kinds"] = [type(h).__name__ for h in handles]
            out["final"] = _full(model)
        out["dirs"] = sorted(p.name for p in Path(root).iterdir() if p.name.startswith("step"))
        run_barrier()  # every rank has listed the folder before rank 0 changes it
        if rank == 0:  # keep the background checkpoint for the other world sizes, then go
            shutil.copytree(root, root + "-bg")  # back to step 4 and train on: bit-equal
            shutil.rmtree(Path(root) / "step-000006")
        run_barrier()
        with ss.init(seed=0) as run:
            model, opt = _build(run, "fsdp")
            state = run.resume(root, keep=2, model=model, optimizer=opt)
            out["resumed_at"] = state.step
            for i in range(state.step + 1, 7):
                _step(run, model, opt, i)
            out["again"] = _full(model)
        return out
    finally:
        holder.close()


def run_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def elsewhere(rank: int, world: int, root: str) -> dict[str, Any]:
    with ss.init(seed=0) as run:
        model, opt = _build(run, "fsdp" if world > 1 else "single")
        state = run.resume(root, keep=2, model=model, optimizer=opt)
        loaded = _full(model)
        _step(run, model, opt, 7)  # the AdamW moments came along: a step works
        return {"step": state.step, "world": state.world_size, "loaded": loaded}


def _equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fsdp_background_saves_resume_bit_equal_at_any_world_size(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    res = spawn(two_ranks, 2, root, timeout=150)
    for r in res:
        assert r["kinds"] == ["SaveHandle"] * 3
        assert r["dirs"] == ["step-000004", "step-000006"]  # keep-last-2 pruned step 2
        assert r["resumed_at"] == 4
        assert _equal(r["again"], r["final"])
    root += "-bg"  # the checkpoint of step 6 as the background save wrote it
    assert (Path(root) / "step-000006" / "dcp" / ".metadata").is_file()
    one = elsewhere(0, 1, root)  # 2 ranks -> 1 rank: no process group, run it here
    assert (one["step"], one["world"]) == (6, 2)
    assert _equal(one["loaded"], res[0]["final"])
    three = spawn(elsewhere, 3, root, timeout=120)
    for r in three:
        assert r["step"] == 6 and _equal(r["loaded"], res[0]["final"])
