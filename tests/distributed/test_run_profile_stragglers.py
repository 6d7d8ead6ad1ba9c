"""run.profile and the straggler report on two real gloo ranks."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from pathlib import Path

import pytest

from splitsync.testing import spawn


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _train(run, steps: int, slow_rank: int | None = None, sleep: float = 0.0,
           mean_first: bool = False) -> None:
    import time

    import torch

    model = run.model(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                          torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        if run.rank == slow_rank:
            time.sleep(sleep)  # a slow data pipeline on one rank
        loss = model(torch.randn(8, 16)).pow(2).mean()
        if mean_first:  # the fast rank waits here, not in the backward
            run.mean(loss.detach())
        run.backward(loss)
        run.step(opt)


def _profile_rank(rank: int, world_size: int, run_dir: str) -> tuple[str, list[str]]:
    import splitsync as ss

    handler = _Collect()
    out = io.StringIO()
    with ss.init(seed=0, run_dir=run_dir) as run, contextlib.redirect_stdout(out):
        logging.getLogger("splitsync").addHandler(handler)
        with run.profile(wait=1, warmup=1, active=3, ranks=(0,)):
            _train(run, 6)
        with run.profile(wait=2, warmup=2, active=1, ranks=(0,)):
            _train(run, 2)  # ends before its active step: said so, no trace
    return out.getvalue(), handler.messages


def test_profile_writes_a_trace_naming_the_model_ops_on_chosen_ranks(tmp_path: Path) -> None:
    (out0, msgs0), (out1, _) = spawn(_profile_rank, 2, str(tmp_path), timeout=180)
    traces = sorted((tmp_path / "profile").glob("*.pt.trace.json"))
    assert [t.name.split(".")[0] for t in traces] == ["rank0"]  # rank 1 was not chosen
    events = json.loads(traces[0].read_text())["traceEvents"]  # Chrome/Perfetto format
    names = {e.get("name") for e in events}
    assert names & {"aten::addmm", "aten::linear"}, sorted(n for n in names if n)[:50]
    steps = {n for n in names if n and n.startswith("ProfilerStep#")}
    assert len(steps) == 3  # the active window: 3 steps
    # The table of top ops on rank 0 (printed and written), nothing printed on rank 1.
    assert "top 10 ops by self time" in out0 and "Self CPU" in out0
    assert "aten::" in (tmp_path / "profile" / "rank0-top-ops.txt").read_text()
    assert "profile" not in out1
    assert any("before the first active step" in m for m in msgs0)


def _straggler_rank(rank: int, world_size: int, mean_first: bool = False,
                    threshold: float | None = 0.25) -> tuple[list[str], int]:
    import splitsync as ss
    from splitsync.observers.stragglers import StepClock

    handler = _Collect()
    with ss.init(seed=0, straggler_threshold=threshold) as run, \
            contextlib.redirect_stdout(io.StringIO()):
        logging.getLogger("splitsync").addHandler(handler)
        clocks = sum(isinstance(o, StepClock) for o in run.observers)
        _train(run, 5, slow_rank=1, sleep=0.3, mean_first=mean_first)
        run.log(loss=1.0)
    return [m for m in handler.messages if m.startswith("straggler")], clocks


@pytest.mark.parametrize("mean_first", [False, True])
def test_straggler_report_names_the_slow_rank(mean_first: bool) -> None:
    """Also when the fast rank does its waiting in run.mean: collectives pause the clock."""
    (reports0, clocks), (reports1, _) = spawn(_straggler_rank, 2, mean_first, timeout=180)
    assert clocks == 1
    assert reports1 == []  # rank 0 reports
    assert len(reports0) == 1, reports0
    assert "rank 1 is slowest" in reports0[0]
    assert "min" in reports0[0] and "median" in reports0[0] and "max" in reports0[0]


def test_no_clock_and_no_report_with_threshold_none() -> None:
    (reports0, clocks), _ = spawn(_straggler_rank, 2, False, None, timeout=180)
    assert clocks == 0 and reports0 == []
