"""run.meter in one process: weighted means, bad input, and a resumed epoch that covers the
whole epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss


def _epoch(run: ss.Run, meter, model: nn.Module, opt, steps: range, save_at: int = -1) -> None:
    for i in steps:
        x = torch.full((i + 1, 2), float(i))
        loss = model(x).pow(2).mean()
        run.backward(loss)
        run.step(opt)
        meter.add(loss=loss, count=x.shape[0])
        meter.add({"batch": float(i)})
        if i == save_at:
            run.save()


def test_a_resumed_epoch_logs_the_whole_epoch(tmp_path: Path) -> None:
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(2, 1))
        meter = run.meter()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        run.resume(tmp_path / "ck", model=model, optimizer=opt)
        assert "meter" in run._checkpoints.registered.others
        _epoch(run, meter, model, opt, range(6), save_at=2)
        whole = meter.compute()
        meter.reset()
        assert meter.compute() == {}
    with ss.init(seed=0) as run:  # a restart after step 3: the meter holds steps 1-3
        torch.manual_seed(0)
        model = run.model(nn.Linear(2, 1))
        meter = run.meter()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        assert run.resume(tmp_path / "ck", model=model, optimizer=opt).step == 3
        _epoch(run, meter, model, opt, range(3, 6))
        resumed = meter.compute()
    assert resumed.keys() == whole.keys() == {"loss", "batch"}
    assert resumed["batch"] == whole["batch"] == 2.5  # the mean over all 6 steps
    assert resumed["loss"] == pytest.approx(whole["loss"], rel=1e-12)
    with ss.init(seed=0) as run:
        meter = run.meter()
        with pytest.raises(ValueError, match="3 elements"):
            meter.add(loss=torch.ones(3))
        with pytest.raises(TypeError, match="a number or a one-element"):
            meter.add(loss="high")
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        run.resume(tmp_path / "ck", model=model, optimizer=opt)  # the meter is loaded too
        assert meter.compute()["batch"] == 1.0  # steps 1-3's batches 0, 1, 2
        with pytest.raises(RuntimeError, match="before run.resume"):
            run.meter()
