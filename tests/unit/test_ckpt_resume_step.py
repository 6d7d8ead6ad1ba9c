"""``run.resume`` given a step folder, or ``step=N``: exactly that step, saves beside it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync import CheckpointError, CheckpointWarning


def _run(root: Path, saves: tuple[int, ...] = (), **resume: object) -> tuple[ss.ResumeState,
                                                                             list[torch.Tensor]]:
    """Resume from ``root`` (with ``resume``'s arguments), take 6 steps and save after the
    steps in ``saves``; return the state resumed and the weights after each step."""
    with ss.init(seed=0, guards=False) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = run.resume(root, model=model, optimizer=opt, keep=5, **resume)
        weights = []
        for step in range(state.step + 1, state.step + 7):
            x = torch.full((2, 3), float(step))
            run.backward(model(x).sum())
            run.step(opt)
            weights.append(model.weight.detach().clone())
            if step in saves:
                run.save()
        return state, weights


def _steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != "latest")


def test_a_step_folder_resumes_that_step_and_saves_beside_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _, weights = _run(ckpt, saves=(2, 4, 6))
    assert _steps(ckpt) == ["step-000002", "step-000004", "step-000006"]
    with pytest.warns(CheckpointWarning, match="step-000006 is newer than the step this run "
                                               "resumed from: set aside"):
        state, again = _run(ckpt / "step-000004", saves=(5,))
    assert state.step == 4 and Path(state.path) == ckpt / "step-000004"
    assert torch.equal(again[0], weights[4])  # step 5 as the first run took it
    # the save went beside step 4, not inside it; step 6 of the abandoned future is kept
    # aside (else it would be the newest: pruned last, resumed next)
    assert _steps(ckpt) == [".rolled-back-step-000006", "step-000002", "step-000004",
                            "step-000005"]
    assert not any(p.name.startswith("step-") for p in (ckpt / "step-000004").iterdir())
    state, _ = _run(ckpt)
    assert state.step == 5


def test_step_goes_back_to_an_older_step_and_a_missing_one_lists_the_steps(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _, weights = _run(ckpt, saves=(2, 4, 6))
    state, again = _run(ckpt, step=2)
    assert state.step == 2 and torch.equal(again[0], weights[2])
    for bad in (3, 9):
        with pytest.raises(CheckpointError, match=rf"no checkpoint of step {bad} in .*ckpt.*: "
                                                  r"the steps there are 2, 4, 6"):
            _run(ckpt, step=bad)
    with pytest.raises(CheckpointError, match="the steps there are 2, 4, 6"):
        _run(ckpt / "step-000009")  # a step folder that is not there: never a fresh start
    with pytest.raises(CheckpointError, match="the folder is step 4; pass .* with step=2"):
        _run(ckpt / "step-000004", step=2)
    with pytest.raises(TypeError, match="step="):
        _run(ckpt, step="4")


def test_a_checkpoint_under_another_name_or_a_work_folder_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _run(ckpt, saves=(2,))
    best = tmp_path / "best"
    shutil.copytree(ckpt / "step-000002", best)
    with pytest.raises(CheckpointError, match=r"holds one checkpoint \(manifest.json\), not "
                                              "step-\\* checkpoints: saves would go inside it"):
        _run(best)
    work = ckpt / ".tmp-step-000003"
    work.mkdir()
    with pytest.raises(CheckpointError, match="not a committed checkpoint"):
        _run(work)
    assert not any(p.name.startswith(("step-", ".tmp-")) for p in best.iterdir())
