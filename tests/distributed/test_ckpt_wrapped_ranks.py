"""run.save with no run.resume before it, at two processes, and a new launch that resumes
from it: weights, optimizer, EMA (made after run.resume there), loader position and RNG
(dropout) come back bit-equal, and the rest of the run matches the uninterrupted one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.testing import spawn

pytestmark = pytest.mark.slow

BEFORE, AFTER = 4, 6  # optimizer steps before the save, and after it (into the next epoch)


def _parts(run: ss.Run) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 1))
    model = run.model(net)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(21, 2, generator=g),
                                          torch.randn(21, 1, generator=g))  # 21: uneven
    # drop_last: a mid-epoch resume pads the epoch's last batch with another sample than
    # the straight run does (the resumed pass wraps around what remained)
    return model, opt, run.loader(data, batch_size=2, shuffle=True, drop_last=True)


def _batches(run: ss.Run, loader: Any, start: int) -> Iterator[Any]:
    for _ in run.epochs(5, start=start):
        yield from loader


def _train(run: ss.Run, model: nn.Module, opt: Any, batches: Iterator[Any], n: int) -> list:
    losses = []
    for _ in range(n):
        x, y = next(batches)
        loss = nn.functional.mse_loss(model(x), y)
        run.backward(loss)
        run.step(opt)
        losses.append(loss.item())
    return losses


def _snapshot(model: nn.Module, ema: nn.Module) -> dict[str, Any]:
    return {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "ema": {k: v.clone() for k, v in ema.state_dict().items()}}


def _straight(rank: int, world: int, root: str) -> dict[str, Any]:
    with ss.init(seed=0) as run:
        model, opt, loader = _parts(run)
        ema = run.ema(model, decay=0.9)
        batches = _batches(run, loader, 0)
        _train(run, model, opt, batches, BEFORE)
        path = run.save(root)  # nothing registered: what the run wrapped
        at_save = _snapshot(model, ema)
        losses = _train(run, model, opt, batches, AFTER)
        return {"path": str(path), "at_save": at_save, "losses": losses,
                "end": _snapshot(model, ema)}


def _resumed(rank: int, world: int, root: str) -> dict[str, Any]:
    with ss.init(seed=0) as run:
        model, opt, loader = _parts(run)
        state = run.resume(root, model=model, optimizer=opt)
        ema = run.ema(model, decay=0.9)  # after run.resume: loaded from the checkpoint
        at_resume = _snapshot(model, ema)
        losses = _train(run, model, opt, _batches(run, loader, state.epoch), AFTER)
        return {"step": state.step, "at_resume": at_resume, "losses": losses,
                "end": _snapshot(model, ema)}


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a[part].keys() == b[part].keys() and all(
        torch.equal(v, b[part][k]) for k, v in a[part].items()) for part in ("model", "ema"))


def test_save_without_resume_then_a_new_launch_resumes_bit_equal(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    straight = spawn(_straight, 2, root, timeout=180)
    assert Path(straight[0]["path"]).name == f"step-{BEFORE:06d}"
    resumed = spawn(_resumed, 2, root, timeout=180)  # a new launch: new processes
    for s, r in zip(straight, resumed, strict=True):
        assert r["step"] == BEFORE
        assert _equal(s["at_save"], r["at_resume"])
        assert r["losses"] == s["losses"]  # same batches, same dropout masks
        assert _equal(s["end"], r["end"])
