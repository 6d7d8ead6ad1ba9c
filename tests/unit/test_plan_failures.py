"""``splitsync plan --failures``: Daly's model and its optimum, the periodic variant, the
fault-tolerant model, and the command's table."""

from __future__ import annotations

import json
import math

import pytest

from splitsync import cli
from splitsync.tools.plan.failures import (
    FailureInputs,
    daly_interval,
    ft_goodput,
    restart_goodput,
    young_interval,
)


def test_dalys_interval_is_near_youngs_and_is_the_optimum() -> None:
    save, mtbf = 60.0, 36000.0
    best = daly_interval(save, mtbf)
    assert best == pytest.approx(young_interval(save, mtbf), rel=0.05)
    inputs = FailureInputs(nodes=1, mtbf=mtbf, save=save, restart=300)
    at = restart_goodput(inputs).goodput
    for other in (best * 0.5, best * 0.8, best * 1.25, best * 2):
        assert restart_goodput(inputs, other).goodput < at


def test_periodic_failures_cost_a_restart_and_half_an_interval() -> None:
    inputs = FailureInputs(nodes=1, mtbf=100, save=1, restart=10, pattern="periodic")
    plan = restart_goodput(inputs, 9.0)
    assert plan.goodput == pytest.approx(0.9 * (1 - (10 + 5) / 100))


def test_fault_tolerance_wins_when_restarts_are_dear_and_costs_a_quorum_otherwise() -> None:
    dear = FailureInputs(nodes=64, mtbf=3600 * 24, save=30, restart=600, step=1, groups=8)
    assert ft_goodput(dear).goodput > restart_goodput(dear).goodput
    calm = FailureInputs(nodes=1, mtbf=1e9, save=1, restart=1, step=1, quorum=0.05)
    assert ft_goodput(calm).goodput == pytest.approx(1 / 1.05, rel=1e-3)
    assert math.isfinite(ft_goodput(calm).interval)


def test_the_job_goodput_counts_the_first_start() -> None:
    inputs = FailureInputs(nodes=1, mtbf=1e12, save=0, restart=0, startup=10, work=90)
    assert restart_goodput(inputs).job_goodput == pytest.approx(0.9, rel=1e-3)


def test_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--failures", "--nodes", "16", "--mtbf-hours", "1000", "--save-s", "20",
            "--restart-s", "120", "--replica-groups", "4"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "| restart " in out and "| fault tolerant " in out
    assert cli.main([*argv, "--json", "--interval-s", "600"]) == 0
    assert len(json.loads(capsys.readouterr().out)["plans"]) == 4
    with pytest.raises(SystemExit, match="--mtbf"):
        cli.main(["plan", "--failures", "--save-s", "1", "--restart-s", "1"])
