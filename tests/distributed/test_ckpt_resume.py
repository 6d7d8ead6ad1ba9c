"""Exact resume on 2 gloo ranks: interrupted runs continue bit-identically to uninterrupted ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss
from splitsync.testing import spawn

EPOCHS = 3
N = 30  # 2 ranks x batch 4: 4 steps per epoch, the last batch short


class Indexed(Dataset):
    """Deterministic samples that carry their own index."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(6, generator=g)
        return x, x.sum().unsqueeze(0), i


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))


def _forkserver() -> Any:
    """This rank's forkserver context, its server holding torch and this module imported
    (set before the server starts: the first loader's first epoch)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", __name__])
    return ctx


def train(root: str, num_workers: int, save_at: tuple[int, ...] = (),
          stop_at: int | None = None) -> dict[str, Any]:
    """One "process lifetime": build everything, resume, train until ``stop_at`` or the end."""
    run = ss.init(seed=0, deterministic=True)
    try:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        # Ranks started by spawn() default to "spawn" for workers too, which re-imports torch
        # in every worker every epoch; a forkserver imports it once per rank. Not "fork":
        # this rank runs several runs' threads, and a fork that races a C++ thread entering
        # Python deadlocks the child on CPython before 3.12 (python/cpython#112275).
        extra = {"multiprocessing_context": _forkserver()} if num_workers else {}
        loader = run.loader(Indexed(), batch_size=4, shuffle=True, num_workers=num_workers,
                            **extra)
        state = run.resume(root, model=model, optimizer=opt, scheduler=sched)
        step, losses, seen = state.step, {}, []
        for _ in run.epochs(EPOCHS, start=state.epoch):
            for x, y, idx in loader:
                loss = F.mse_loss(model(x), y)
                run.backward(loss)
                run.step(opt)
                sched.step()
                step += 1
                losses[step] = loss.item()
                seen.extend(loader.trim_padding(idx).tolist())
                if step in save_at:
                    run.save(root, note=f"step {step}")
                if step == stop_at:  # the process "dies" here: later steps are lost
                    return {"losses": losses, "seen": seen, "params": None, "state": state}
        # numpy copies: tensors returned through a queue would share memory with a dead child
        params = [p.detach().numpy().copy() for p in run.unwrap(model).parameters()]
        return {"losses": losses, "seen": seen, "params": params, "state": state}
    finally:
        run.close()


def scenarios(rank: int, world: int, root: str, num_workers: int) -> dict[str, Any]:
    holder = ss.init(seed=0)  # keeps the process group across the simulated restarts
    try:
        out: dict[str, Any] = {"base": train(f"{root}/base", num_workers)}
        plans = {
            "mid": [dict(save_at=(6,), stop_at=7), {}],  # epoch 1 has steps 5..8
            "boundary": [dict(save_at=(8,), stop_at=10), {}],
            "chained": [dict(save_at=(3,), stop_at=5), dict(save_at=(8,), stop_at=9), {}],
        }
        for name, phases in plans.items():
            out[name] = [train(f"{root}/{name}", num_workers, **kw) for kw in phases]
        return {k: _plain(v) for k, v in out.items()}
    finally:
        holder.close()


def _plain(v: Any) -> Any:
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        st = v["state"]
        return {**v, "state": (st.step, st.epoch, dict(st.extra))}
    return v


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_is_bit_exact(tmp_path: Path, num_workers: int) -> None:
    results = spawn(scenarios, 2, str(tmp_path), num_workers, timeout=140)
    for rank, res in enumerate(results):
        base = res["base"]
        assert sorted(base["losses"]) == list(range(1, 13))
        for name, saved in (("mid", 6), ("boundary", 8)):
            first, second = res[name]
            assert second["state"][:2] == (saved, 2 if saved == 8 else 1), name
            assert second["state"][2] == {"note": f"step {saved}"}
            assert min(second["losses"]) == saved + 1  # lost steps were recomputed
            for step, loss in {**first["losses"], **second["losses"]}.items():
                assert loss == base["losses"][step], (rank, name, step)
            for a, b in zip(second["params"], base["params"], strict=True):
                assert torch.equal(torch.from_numpy(a), torch.from_numpy(b)), (rank, name)
        one, two, three = res["chained"]
        assert (two["state"][0], three["state"][0]) == (3, 8)
        merged = {**one["losses"], **two["losses"], **three["losses"]}
        assert merged == base["losses"]
        for a, b in zip(three["params"], base["params"], strict=True):
            assert torch.equal(torch.from_numpy(a), torch.from_numpy(b)), (rank, "chained")
    # Ranks really saw different data and the model really used dropout (not a trivial pass).
    assert results[0]["base"]["losses"] != results[1]["base"]["losses"]
