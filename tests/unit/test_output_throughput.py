"""Throughput: samples/s, tokens/s, MFU and the peak table."""

from __future__ import annotations

import pytest

from splitsync.output.throughput import (
    PEAK_BF16_TFLOPS,
    Throughput,
    ThroughputStats,
    aggregate,
    peak_flops_for,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_samples_tokens_and_mfu_from_a_fake_clock() -> None:
    clock = FakeClock()
    tp = Throughput(flops_per_sample=2e9, tokens_per_sample=128, peak_flops=1e12, clock=clock)
    for _ in range(4):
        clock.t += 0.5
        tp.step(samples=50)
    s = tp.compute()
    assert s.samples_per_s == pytest.approx(100.0)  # 200 samples in 2 s
    assert s.tokens_per_s == pytest.approx(12_800.0)
    assert s.flops_per_s == pytest.approx(2e11)
    assert s.mfu == pytest.approx(0.2)
    assert "MFU 20.0%" in s.summary() and "100.0 samples/s" in s.summary()


def test_window_keeps_only_recent_steps_and_start_resets() -> None:
    clock = FakeClock()
    tp = Throughput(window=2, clock=clock)
    clock.t += 10.0
    tp.step(samples=1)  # slow first step (compilation) falls out of the window
    for _ in range(2):
        clock.t += 1.0
        tp.step(samples=10)
    assert tp.steps == 2
    assert tp.compute().samples_per_s == pytest.approx(10.0)
    tp.start()
    with pytest.raises(RuntimeError, match="at least one step"):
        tp.compute()


def test_without_flops_or_peak_there_is_no_mfu() -> None:
    clock = FakeClock()
    tp = Throughput(flops_per_sample=1e9, clock=clock)  # no device, no peak
    clock.t += 1.0
    tp.step(samples=3)
    s = tp.compute()
    assert s.flops_per_s == pytest.approx(3e9) and s.mfu is None and s.tokens_per_s is None


@pytest.mark.parametrize("name,tflops", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L4", 121.0),
    ("NVIDIA L40S", 362.0), ("NVIDIA GeForce RTX 4090", 165.0)])
def test_peak_table_lookup(name: str, tflops: float) -> None:
    assert peak_flops_for(name) == pytest.approx(tflops * 1e12)


def test_unknown_device_has_no_peak_and_cpu_device_gives_none() -> None:
    assert peak_flops_for("Some Future Accelerator") is None
    assert Throughput(device="cpu").peak_flops is None
    assert all(t > 0 for _, t in PEAK_BF16_TFLOPS)


class FakeRun:
    world_size = 4

    def sum(self, x: float) -> float:
        return 4 * x  # as if every rank had the same rate


def test_aggregate_over_ranks_is_the_sum() -> None:
    clock = FakeClock()
    tp = Throughput(flops_per_sample=1e9, peak_flops=1e11, clock=clock)
    clock.t += 1.0
    tp.step(samples=10)
    s = tp.compute(FakeRun())
    assert s.samples_per_s == pytest.approx(40.0) and s.world_size == 4
    assert s.mfu == pytest.approx(0.1)  # 4e10 FLOP/s over 4 x 1e11
    parts = [ThroughputStats(10.0, 100.0, 1e10, 0.1, 1), ThroughputStats(30.0, 300.0, 3e10, 0.3, 1)]
    total = aggregate(parts)
    assert (total.samples_per_s, total.tokens_per_s, total.world_size) == (40.0, 400.0, 2)
    assert total.mfu == pytest.approx(4e10 / 2e11)


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"flops_per_sample": 0},
                                    {"peak_flops": -1.0}, {"tokens_per_sample": -5}])
def test_bad_arguments_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Throughput(**kwargs)
