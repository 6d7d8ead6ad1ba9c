"""The verbs a port from Accelerate or Fabric looks for, at two processes: main_process_first
(global, and per node on two simulated one-process nodes), sync_gradients and what run.step
returns inside an accumulation window, run.no_sync (also overriding the window's end), and
run.min. One spawn for all of it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.testing import spawn

pytestmark = pytest.mark.slow


def _note(log: Path, line: str) -> None:
    with open(log, "a") as f:  # O_APPEND: each line lands whole
        f.write(line + "\n")


def _wait_for(log: Path, line: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while line not in log.read_text().splitlines():
        if time.monotonic() > deadline:
            raise AssertionError(f"{line!r} never appeared in {log.read_text()!r}")
        time.sleep(0.01)


def _grads(run: ss.Run, model: nn.Module) -> list[list[float]]:
    """Every rank's flattened gradient, in rank order."""
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    return run.gather(flat.unsqueeze(0)).tolist()


def _verbs(rank: int, world: int, root: str) -> dict[str, Any]:
    # two nodes of one process each: every rank is its node's local rank 0
    os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank))
    ordered, together = Path(root) / "ordered.log", Path(root) / "together.log"
    out: dict[str, Any] = {}
    with ss.init(seed=0, accumulate=2) as run:
        out["local_rank"] = run.local_rank
        with run.main_process_first():  # rank 0's block ends before rank 1's begins
            _note(ordered, f"{rank} in")
            _note(ordered, f"{rank} out")
        with run.main_process_first(local=True):  # both are first on their node
            _note(together, f"{rank} in")
            _wait_for(together, f"{1 - rank} in")  # so both are inside at once
        model = run.model(nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.full((2, 3), float(rank + 1))
        window = []
        for _ in range(2):
            run.backward(model(x).pow(2).mean())
            synced = run.sync_gradients
            result = run.step(opt)
            window.append((synced, result.stepped, bool(result), result.norm is None))
        out["window"] = window
        # the window's last micro-step inside run.no_sync: it does not sync after all
        run.backward(model(x).pow(2).mean())
        with run.no_sync(model):
            run.backward(model(x).pow(2).mean())
        out["held_grads"] = _grads(run, model)
        opt.zero_grad(set_to_none=True)
        # a window of its own: Fabric's no_backward_sync for the first micro-step (which
        # would not sync here anyway), then the window's end syncs what both left
        with run.no_sync(model):
            run.backward(model(torch.full((2, 3), float(rank + 1))).sum())
        out["local_grads"] = _grads(run, model)
        run.backward(model(torch.full((2, 3), float(rank + 3))).sum())
        out["synced_grads"] = _grads(run, model)
        with run.no_sync(model, enabled=False):  # an ordinary block
            pass
        out["min"] = (run.min(float(rank) + 0.5), run.min(torch.tensor([rank, -rank])).tolist())
        out["max"] = run.max(float(rank))
    return out


def test_migration_verbs_at_two_processes(tmp_path: Path) -> None:
    out = spawn(_verbs, 2, str(tmp_path), timeout=180)
    assert [o["local_rank"] for o in out] == [0, 0]
    lines = (tmp_path / "ordered.log").read_text().splitlines()
    assert lines == ["0 in", "0 out", "1 in", "1 out"], lines
    for o in out:
        # (sync_gradients, stepped, truthy, no norm) per micro-step of a window of 2
        assert o["window"] == [(False, False, False, True), (True, True, True, True)]
        held = o["held_grads"]
        assert held[0] != held[1]  # not averaged: each rank kept its own
        local, synced = o["local_grads"], o["synced_grads"]
        assert local[0] != local[1]
        # d/dw sum(w.x + b) over 2 rows, halved by accumulate=2: (r+1), then (r+3), on
        # rank r; the bias gets 1 each time. Averaged over the ranks: 5 and 2.
        expect = [5.0, 5.0, 5.0, 2.0]
        assert synced[0] == synced[1] == pytest.approx(expect)
        assert o["min"] == (0.5, [0, -1]) and o["max"] == 1.0
