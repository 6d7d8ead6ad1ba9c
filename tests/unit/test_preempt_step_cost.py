"""Armed for preemption, a step runs no Python the unarmed step does not (issue 43, point 2):
until a stop is requested nothing is hooked on the models and nothing watches ``run.step``;
only the watching thread, asleep between its looks, knows the run is armed."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import splitsync as ss


def _python_calls(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer,
                  steps: int) -> Counter[str]:
    """The Python functions the main thread enters over ``steps`` steps, with their counts."""
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    calls: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[f"{frame.f_code.co_filename}:{frame.f_code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        for _ in range(steps):
            run.backward(F.cross_entropy(model(x), y))
            run.step(opt)
    finally:
        sys.setprofile(None)
    return calls


def test_an_armed_step_calls_nothing_an_unarmed_step_does_not(tmp_path: Path) -> None:
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(4, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _python_calls(run, model, opt, 2)  # first-step work, not counted
        unarmed = _python_calls(run, model, opt, 5)
        run.resume(tmp_path / "ck", model=model, optimizer=opt)  # arms: handlers, board, the watching thread
        assert run._preemption is not None, "run.resume did not arm (preempt_signals default)"
        _python_calls(run, model, opt, 2)
        armed = _python_calls(run, model, opt, 5)
    assert armed == unarmed, f"armed steps also ran {armed - unarmed}"
