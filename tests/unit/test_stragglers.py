"""The straggler report's arithmetic and its clock (pure: no processes)."""

from __future__ import annotations

import math

import pytest

from splitsync.stragglers import StepClock, straggler_report


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
