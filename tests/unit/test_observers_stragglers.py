"""The straggler report's arithmetic and its clock (pure: no processes)."""

from __future__ import annotations

import math

import pytest

from splitsync.observers.stragglers import StepClock, straggler_report


def test_slowest_rank_named_with_min_median_max() -> None:
    report = straggler_report([0.010, 0.011, 0.050, 0.012], period=0.100, threshold=0.25)
    assert report is not None and report.slowest == 2
    assert (report.min, report.median, report.max) == pytest.approx((0.010, 0.0115, 0.050))
    text = report.message()
    assert "rank 2 is slowest" in text and "about 39.0 ms" in text and "39% of a 100.0 ms" in text
    assert "min 10.0 ms / median 11.5 ms / max 50.0 ms" in text


@pytest.mark.parametrize("times", [
    [0.010, 0.030],            # 20 ms of a 100 ms step: below a quarter
    [0.0001, 0.004],           # 40x, but under 5 ms: scheduling noise
    [0.010, math.nan],         # a rank without steps since the last log
    [0.010],                   # one rank
])
def test_no_report(times: list[float]) -> None:
    assert straggler_report(times, period=0.100, threshold=0.25) is None


def test_clock_counts_own_time_per_step_in_its_slot() -> None:
    clock = StepClock()
    clock.pause()
    for _ in range(4):
        clock.resume(stepped=True)
        clock.pause()
    slots, period = clock.take(rank=1, world_size=3)
    assert slots[0] == slots[2] == 0.0 and 0.0 <= slots[1] <= period
    assert math.isnan(clock.take(rank=1, world_size=3)[0][1])  # reset: no steps since


class _Ticks:
    """A fake clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_clock_as_observer_pauses_inside_collectives_and_reports_on_rank0(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from splitsync.observers import stragglers

    ticks = _Ticks()
    monkeypatch.setattr(stragglers, "_now", ticks)
    said: list[str] = []
    clock = stragglers.StepClock(rank=0, world_size=2, threshold=0.25, report=said.append)

    def wait(seconds: float) -> str:  # a collective in which this rank waits
        ticks.t += seconds
        return "done"

    for _ in range(4):
        ticks.t += 0.010  # own work: 10 ms
        assert clock.around_collective(stragglers.BACKWARD_OP, wait, 0.090) == "done"
        ticks.t += 0.001
        clock.around_collective("all_reduce", wait, 0.005)  # run.mean: waiting is not own time
    slots = clock.log_extra()
    assert slots[1] == 0.0 and slots[0] == pytest.approx(0.011 - 0.010 / 4)  # first 10 ms: setup
    # rank 1's own time arrives averaged in slot 1 (mean over 2 ranks: half of it)
    clock.on_log_extra([slots[0] / 2, 0.080 / 2])
    assert clock.last is not None and clock.last.slowest == 1
    assert len(said) == 1 and "rank 1 is slowest" in said[0]
    # rank 1 never reports, whatever the times
    other = stragglers.StepClock(rank=1, world_size=2, threshold=0.25, report=said.append)
    other.on_log_extra([0.040, 0.0])
    assert len(said) == 1
