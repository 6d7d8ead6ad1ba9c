"""The walk of ``run.save``: the modules a save passes through, at one process.

A save asks the strategy that made the model (recorded by ``run.model``), not every
strategy in turn; a background save's watch re-wires ``run.step`` only, not every part of
the Run; and at one process no rank is gathered from or told anything.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import splitsync as ss
from splitsync.strategies import for_model, get_strategy


def _walk(action: Callable[[], Any]) -> list[str]:
    seen: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> None:
        name = frame.f_globals.get("__name__", "")
        if event == "call" and name.startswith("splitsync.") and name not in seen:
            seen.append(name)

    sys.setprofile(tracer)
    threading.setprofile(tracer)  # the background save's own thread
    try:
        action()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return seen


def test_a_save_visits_only_the_modules_it_needs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    with ss.init(seed=0) as run:
        model = run.model(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # it has state to save
        run.resume(tmp_path / "ck", model=model, optimizer=opt)
        walks = {}
        for blocking in (True, False):
            def save(blocking: bool = blocking) -> None:
                handle = run.save(blocking=blocking)
                if hasattr(handle, "wait"):
                    handle.wait()

            for _ in range(2):  # the first save imports and allocates; the second is walked
                model(torch.randn(2, 4)).sum().backward()
                run.step(opt)
                walks[blocking] = _walk(save)
    for blocking, mods in walks.items():
        others = {f"splitsync.strategies.{n}" for n in ("ddp", "hsdp", "fsdp", "dp")}
        assert not others & set(mods), (blocking, mods)  # no strategy asked in turn
        assert "splitsync.distributed.comm" not in mods  # one process: nothing to gather
        assert "splitsync.distributed.seeding" not in mods  # no run.generator stream to capture
    assert len(walks[True]) <= 18, walks[True]
    background = set(walks[False])
    # the watch re-wires run.step alone: the Run's other parts keep their functions
    assert not {"splitsync.run.models", "splitsync.run.data", "splitsync.run.logging",
                "splitsync.run.collectives"} & background, walks[False]
    assert len(walks[False]) <= 20, walks[False]


def test_a_model_names_the_strategy_that_made_it() -> None:
    with ss.init(seed=0) as run:
        plain = torch.nn.Linear(2, 2)
        made = run.model(plain)
        assert for_model(made) is get_strategy("single")
        compiled_like = torch.nn.Sequential(made)  # a module run.model did not make
        assert for_model(compiled_like) is get_strategy("single")  # asked, and unclaimed
    # an unknown mark is not trusted: the strategies are asked instead
    other = torch.nn.Linear(2, 2)
    object.__setattr__(other, "_splitsync_strategy", "no-such-strategy")
    assert for_model(other) is get_strategy("single")
