"""Each runtime guard provoked on 2 real gloo ranks; the messages must name what went wrong."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync
from splitsync.observers.guards import (
    CollectiveTimeoutError,
    ConfigMismatchError,
    ParameterMismatchError,
)
from splitsync.testing import spawn

pytestmark = pytest.mark.timeout(120)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _config_mismatch(rank: int, world: int) -> str:
    sys.argv = ["train.py", "--lr", "0.1" if rank == 0 else "0.01"]
    try:
        splitsync.init(seed=0)
    except ConfigMismatchError as exc:
        return str(exc)
    return "no error"


def test_different_arguments_name_the_rank_and_argument() -> None:
    for msg in spawn(_config_mismatch, 2):
        assert "rank 1: argument 2 = '0.01'" in msg
        assert "(rank 0: '0.1')" in msg


def _params_mismatch(rank: int, world: int, guards: bool) -> str:
    with splitsync.init(seed=0, guards=guards) as run:
        torch.manual_seed(rank)  # the lesson's mistake: each rank initialises its own weights
        try:
            run.model(Net())
        except ParameterMismatchError as exc:
            return str(exc)
    return "no error"


def test_different_initial_parameters_name_parameter_and_ranks() -> None:
    for msg in spawn(_params_mismatch, 2, True):
        assert "first differing parameter 'fc.weight'" in msg
        assert "rank(s) [1] differ from rank(s) [0]" in msg
        assert "init(seed=0)" in msg


def test_guards_false_turns_the_parameter_check_off() -> None:
    assert spawn(_params_mismatch, 2, False) == ["no error", "no error"]


def _device_mismatch(rank: int, world: int, guards: bool) -> tuple[str, str]:
    with splitsync.init(seed=0, guards=guards) as run:
        model = run.model(Net())
        x = torch.zeros(2, 3, device="meta")  # a batch left on another device
        try:
            model(x)
        except RuntimeError as exc:
            return type(exc).__name__, str(exc)
    return "none", ""


def test_device_mismatch_names_parameters_inputs_and_devices() -> None:
    for kind, msg in spawn(_device_mismatch, 2, True):
        assert kind == "DeviceMismatchError"
        assert "parameters on cpu: fc.weight, fc.bias" in msg
        assert "inputs on meta: input[0]" in msg
        assert "run.to_device(batch)" in msg


def test_device_guard_is_off_with_guards_false() -> None:
    for kind, msg in spawn(_device_mismatch, 2, False):
        assert kind == "RuntimeError" and "fc.weight" not in msg


def _busy_until(mark: Path, within: float = 60.0) -> None:
    """Stay away (busy elsewhere, group alive) until the other rank wrote ``mark``: a rank
    that left early would show up as a closed connection, not as a rank that never came."""
    until = time.monotonic() + within
    while not mark.exists() and time.monotonic() < until:
        time.sleep(0.05)


def _skip_collective(rank: int, world: int, mark: str) -> str:
    with splitsync.init(seed=0, timeout=3) as run:
        if rank == 1:
            _busy_until(Path(mark))  # rank 1 skips the collective and is busy elsewhere
            return "skipped"
        try:
            run.mean(1.0)
        except CollectiveTimeoutError as exc:
            Path(mark).touch()
            return str(exc)
    Path(mark).touch()
    return "no error"


def test_rank_that_skips_a_collective_is_named_instead_of_a_hang(tmp_path: Path) -> None:
    msg, skipped = spawn(_skip_collective, 2, str(tmp_path / "reported"), timeout=90)
    assert skipped == "skipped"
    assert "Rank 0: collective call #1 all_reduce at" in msg
    assert Path(__file__).name in msg
    assert "rank 1 never arrived" in msg


def _out_of_step(rank: int, world: int, late: int = -1) -> str:
    with splitsync.init(seed=0, timeout=3) as run:
        if rank == late:
            time.sleep(2.0)  # arrives long after the other rank's grace period began
        try:
            if rank == 0:
                run.mean(1.0)
            else:
                run.barrier()
        except CollectiveTimeoutError as exc:
            return str(exc)
    return "no error"


def test_ranks_at_different_collectives_are_reported_out_of_step() -> None:
    msg0, msg1 = spawn(_out_of_step, 2, timeout=90)
    assert "rank 1 is at call #1 barrier" in msg0
    assert "rank 0 is at call #1 all_reduce" in msg1


@pytest.mark.parametrize("late", [0, 1])
def test_out_of_step_is_explained_when_one_rank_arrives_late(late: int) -> None:
    # A loaded machine: one rank reaches its collective seconds after the other; the rank
    # that fails first must still learn where the late one waits (its responder answers).
    msg0, msg1 = spawn(_out_of_step, 2, late, timeout=90)
    assert "rank 1 is at call #1 barrier" in msg0
    if late == 0:  # rank 1 fails first; when rank 1 is late, rank 0's close() releases it
        assert "rank 0 is at call #1 all_reduce" in msg1


def _good_run(rank: int, world: int) -> float:
    with splitsync.init(seed=0, timeout=30) as run:
        model = run.model(Net())
        loss = model(torch.ones(2, 3)).sum()
        run.backward(loss)
        run.barrier()
        return float(run.mean(float(rank)))


def test_guards_stay_silent_on_a_correct_run() -> None:
    assert spawn(_good_run, 2) == [0.5, 0.5]


def _uneven_backward(rank: int, world: int, mark: str) -> str:
    with splitsync.init(seed=0, timeout=3) as run:
        model = run.model(Net())
        batches = 2 if rank == 0 else 1  # uneven data: rank 0 has one batch more
        try:
            for _ in range(batches):
                run.backward(model(torch.ones(2, 3)).sum())
            if rank == 1:
                _busy_until(Path(mark))  # rank 1 is done and busy elsewhere
        except CollectiveTimeoutError as exc:
            Path(mark).touch()
            return str(exc)
        Path(mark).touch()
    return "no error"


def test_extra_backward_on_one_rank_names_the_absent_rank(tmp_path: Path) -> None:
    msg = spawn(_uneven_backward, 2, str(tmp_path / "reported"), timeout=90)[0]
    # DDP's next forward already communicates (bucket rebuild), so that is where rank 0 waits
    assert "Rank 0: collective call #2 forward at" in msg
    assert "rank 1 never arrived" in msg


def _nested_runs(rank: int, world: int) -> dict[str, object]:
    from splitsync.observers.guards.attach import GuardObserver
    from splitsync.observers.guards.responder import run_key

    def watch(run: splitsync.Run) -> object:
        return next(o for o in run.observers if isinstance(o, GuardObserver)).watch

    with splitsync.init(seed=0, timeout=30) as outer:  # kept open, as a notebook or test does
        outer_watch = watch(outer)
        with splitsync.init(seed=0, timeout=30) as inner:
            inner_watch = watch(inner)
            inner_thread = inner_watch._responder._thread
        outer_thread = outer_watch._responder._thread
        return {"names": (run_key(outer_watch.side_group), run_key(inner_watch.side_group)),
                "inner_alive": inner_thread.is_alive(), "outer_alive": outer_thread.is_alive()}


def test_a_run_closed_inside_another_stops_its_own_responder_only() -> None:
    """Two runs alive at once each see the store under their own prefix: the inner run's stop word
    must end its own thread (not the outer run's, which would leave the inner one waiting
    5 s at close and the outer run unable to answer a peer)."""
    for got in spawn(_nested_runs, 2, timeout=90):
        outer, inner = got["names"]
        assert outer and inner and outer != inner, got
        assert not got["inner_alive"] and got["outer_alive"], got
