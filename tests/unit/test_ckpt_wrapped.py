"""Checkpoints without registering first: the step count is the run's own, run.save saves
what the run wrapped, Fabric-style state dicts with run.save(state=...) / run.load, and an
EMA made after run.resume. One process each; the two-process launches are in
tests/distributed/test_ckpt_wrapped_ranks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.errors import CheckpointError


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))


def _train(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for i in range(steps):
        run.backward(model(torch.full((2, 3), float(i))).pow(2).mean())
        run.step(opt)


def _steps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("step-"))


@pytest.mark.parametrize("accumulate", [1, 3])
def test_a_late_resume_keeps_the_steps_the_run_took(tmp_path: Path, accumulate: int) -> None:
    with ss.init(seed=0, accumulate=accumulate) as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _train(run, model, opt, 7 * accumulate)  # 7 optimizer steps, counted by run.step
        state = run.resume(tmp_path, model=model, optimizer=opt)  # nothing there to load
        assert not state.resumed and state.step == 7
        run.save()
        _train(run, model, opt, 2 * accumulate)
        run.save()
    assert _steps(tmp_path) == ["step-000007", "step-000009"]


def test_save_without_resume_writes_what_the_run_wrapped(tmp_path: Path) -> None:
    with ss.init(seed=0) as run:
        teacher = run.model(_net())  # made first, trained by nothing: not "model"
        model = run.model(_net())
        ema = run.ema(model, decay=0.5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.arange(10.0).unsqueeze(1))
        loader = run.loader(data, batch_size=3, shuffle=True)
        with pytest.raises(TypeError, match=r"needs a directory.*run\.save\('ckpt/'\)"):
            run.save()
        with pytest.raises(TypeError, match="stepped no optimizer: pass step="):
            run.save(tmp_path)
        next(iter(loader))
        _train(run, model, opt, 4)
        saved = run.save(tmp_path)
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        averaged = {k: v.clone() for k, v in ema.state_dict().items()}
    manifest = json.loads((saved / "manifest.json").read_text())["body"]
    assert saved.name == "step-000004"
    assert sorted(manifest["models"]) == ["ema", "model", "model_1"]
    assert manifest["optimizers"] == {"optimizer": "model"}
    assert manifest["loaders"][0]["consumed"] == 3  # the position of the loader it made
    with ss.init(seed=0) as run:  # a new run, registering by the same names
        run.model(_net())
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = run.resume(tmp_path, model=model, optimizer=opt, model_1=teacher)
        ema = run.ema(model, decay=0.5)  # after run.resume: loaded from the checkpoint
        assert state.step == 4 and len(opt.state) == 0  # plain SGD: no per-parameter state
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
        assert all(torch.equal(v, ema.state_dict()[k]) for k, v in averaged.items())
        assert not torch.equal(ema[0].weight, model[0].weight)


def test_bare_resume_takes_what_the_run_wrapped_and_never_drops_optimizer_state(
        tmp_path: Path) -> None:
    with ss.init(seed=0) as run:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        _train(run, model, opt, 2)
        run.save(tmp_path)
        run.resume(tmp_path)  # in the same run: the optimizer run.step stepped is known
        assert run._checkpoints.step == 2
    with ss.init(seed=0) as run:
        run.model(_net())
        with pytest.raises(CheckpointError, match=r"holds optimizer state \['optimizer'\].*"
                                                  r"optimizer=opt"):
            run.resume(tmp_path)  # a new run has stepped no optimizer yet


def test_fabric_style_state_dicts_save_and_load(tmp_path: Path) -> None:
    with ss.init(seed=0) as run:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        state = {"model": model, "opt": opt, "sched": sched, "epoch": 3, "best": [0.25]}
        _train(run, model, opt, 2)
        sched.step()
        first = run.save(tmp_path, state=state)
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        lr = opt.param_groups[0]["lr"]
        state["epoch"] = 4
        _train(run, model, opt, 1)
        sched.step()
        run.save(tmp_path, state=state, note="extra")
        with pytest.raises(TypeError, match=r"\['best'\] given twice"):
            run.save(tmp_path, state=state, best=1)
        # back to the first: objects loaded in place, plain values replaced in the dict
        loaded = run.load(tmp_path, state, step=2)
        assert loaded.path == first and loaded.step == 2
        assert state["epoch"] == 3 and state["best"] == [0.25]
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
        assert opt.param_groups[0]["lr"] == lr and sched.last_epoch == 1
        assert run.load(tmp_path, state).extra["note"] == "extra"  # the newest
        assert state["epoch"] == 4
        with pytest.raises(CheckpointError, match=r"no checkpoint of step 5 .*"
                                                  r"steps there are 2, 3"):
            run.load(tmp_path, state, step=5)
        with pytest.raises(CheckpointError, match="no checkpoint under"):
            run.load(tmp_path / "empty", state)
