"""The cost model behind `splitsync plan` against the textbook formulas."""

from __future__ import annotations

import math

import pytest

from splitsync.tools.plan import costmodel as cm

NET = cm.Network("test", bandwidth=10e9, latency=5e-6)


def test_ring_allreduce_matches_textbook_formula() -> None:
    # t = 2(N-1)·alpha + 2(N-1)/N · bytes/B, written out for N = 8, 100 MB
    n, b = 8, 100e6
    expected = 2 * 7 * 5e-6 + 2 * 7 / 8 * b / 10e9
    assert cm.ring_allreduce_time(b, n, NET) == pytest.approx(expected, rel=1e-12)
    assert cm.ring_allreduce_time(b, 1, NET) == 0.0
    # large N: bandwidth term tends to 2·bytes/B, latency grows linearly
    t_big = cm.ring_allreduce_time(b, 10_000, NET)
    assert t_big == pytest.approx(2 * 9999 * 5e-6 + 2 * b / 10e9, rel=1e-3)


def test_bus_bandwidth_is_nccl_tests_definition() -> None:
    algbw, busbw = cm.bus_bandwidth(1e9, 0.5, 4)
    assert algbw == 2e9
    assert busbw == pytest.approx(2e9 * 2 * 3 / 4)


def test_ddp_buckets_first_small_then_capped() -> None:
    mib = 1024 * 1024
    buckets = cm.ddp_buckets(60 * mib, bucket_cap_mb=25)
    assert buckets == [1 * mib, 25 * mib, 25 * mib, 9 * mib]
    assert cm.ddp_buckets(0.5 * mib) == [0.5 * mib]
    assert cm.ddp_buckets(0) == []


def test_no_overlap_exposes_all_communication() -> None:
    buckets = cm.ddp_buckets(100e6)
    total, exposed = cm.exposed_comm(buckets, 8, NET, backward_time=1.0, overlap=False)
    assert exposed == pytest.approx(total)
    assert total == pytest.approx(sum(cm.ring_allreduce_time(b, 8, NET) for b in buckets))


def test_overlap_hides_communication_behind_long_backward() -> None:
    buckets = cm.ddp_buckets(100e6)
    total, exposed = cm.exposed_comm(buckets, 8, NET, backward_time=10.0)
    # only the last bucket, ready when backward ends, is exposed
    assert exposed == pytest.approx(cm.ring_allreduce_time(buckets[-1], 8, NET))
    assert exposed < total


def test_overlap_with_short_backward_exposes_the_remainder() -> None:
    buckets = cm.ddp_buckets(100e6)
    total, exposed = cm.exposed_comm(buckets, 8, NET, backward_time=1e-6)
    assert exposed == pytest.approx(total - 1e-6 + buckets[0] / 100e6 * 1e-6, rel=1e-6)


def test_predict_step_efficiency_and_throughput() -> None:
    p1 = cm.predict(0.1, 50e6, 1, NET, batch_size=32)
    assert (p1.step_time, p1.efficiency, p1.throughput) == (0.1, 1.0, 320.0)
    p = cm.predict(0.1, 50e6, 64, NET, overlap=False, batch_size=32)
    comm = sum(cm.ring_allreduce_time(b, 64, NET) for b in cm.ddp_buckets(50e6))
    assert p.step_time == pytest.approx(0.1 + comm)
    assert p.efficiency == pytest.approx(0.1 / (0.1 + comm))
    assert p.throughput == pytest.approx(64 * 32 / (0.1 + comm))
    steps = [q.step_time for q in cm.predict_many(0.1, 50e6, NET)]
    assert steps == sorted(steps)  # more devices never make a step faster


def test_fit_network_recovers_alpha_and_bandwidth() -> None:
    sizes = [1e3, 1e5, 1e6, 1e7, 6.4e7]
    times = [cm.ring_allreduce_time(s, 2, NET) for s in sizes]
    fit = cm.fit_network(sizes, times, 2)
    assert fit.bandwidth == pytest.approx(NET.bandwidth, rel=1e-6)
    assert fit.latency == pytest.approx(NET.latency, rel=1e-6)


@pytest.mark.parametrize("text,value", [("124M", 124_000_000), ("7B", 7_000_000_000),
                                        ("1.5g", 1_500_000_000), ("3.5e6", 3_500_000), (42, 42)])
def test_parse_count(text: object, value: int) -> None:
    assert cm.parse_count(text) == value  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "12X", "-3M", "0"])
def test_parse_count_rejects_bad_input(bad: str) -> None:
    with pytest.raises(ValueError, match="parameter count"):
        cm.parse_count(bad)


def test_presets_are_sane_and_named() -> None:
    for name in ("nvlink4", "ib-400g", "eth-100g"):
        net = cm.NETWORKS[name]
        assert net.bandwidth > 1e9 and 0 < net.latency < 1e-3
    assert cm.NETWORKS["ib-400g"].bandwidth == pytest.approx(400e9 / 8)
    with pytest.raises(ValueError):
        cm.Network("bad", 0, 1e-6)


def test_advice_names_compression_and_fsdp_when_they_pay() -> None:
    eth = cm.NETWORKS["eth-100g"]
    preds = cm.predict_many(0.9, 14e9, eth, (1, 2, 8))
    notes = cm.advice(preds, 7_000_000_000, 14e9, net=eth, step_time=0.9, memory_gb=80)
    comp = next(n for n in notes if "From 2 devices" in n)
    half = cm.predict(0.9, 7e9, 2, eth)
    assert "compression" in comp and f"{1e3 * half.step_time:.1f} ms" in comp
    assert any("FSDP" in n and "pays off" in n for n in notes)
    nv = cm.NETWORKS["nvlink4"]
    small = cm.predict_many(1.0, 4e6, nv, (1, 2, 8))
    quiet = cm.advice(small, 1_000_000, 4e6, net=nv, step_time=1.0, memory_gb=80)
    assert any("would not pay off" in n for n in quiet)
    assert any("only add communication" in n for n in quiet)
    assert math.isclose(small[0].efficiency, 1.0)


def test_advice_on_latency_bound_communication_says_compression_does_not_help() -> None:
    slow = cm.Network("slow-latency", 100e9, 1e-3)  # 1 ms per message, fast links
    preds = cm.predict_many(1e-3, 1e4, slow, (1, 8))
    notes = cm.advice(preds, 2500, 1e4, net=slow, step_time=1e-3)
    assert any("latency-bound" in n and "would not help" in n for n in notes)


def test_compute_scale_slows_per_device_compute_at_n_only() -> None:
    # step(N) = s·c + exposed(backward = f·s·c); c does not apply to the single device
    s, grad, c, f = 0.01, 30e3, 1.7, 0.6
    p = cm.predict(s, grad, 2, NET, compute_scale=c, backward_fraction=f)
    _, exposed = cm.exposed_comm(cm.ddp_buckets(grad), 2, NET, f * s * c)
    assert p.step_time == pytest.approx(s * c + exposed)
    assert p.efficiency == pytest.approx(s / (s * c + exposed))
    assert cm.predict(s, grad, 1, NET, compute_scale=c).step_time == s
    _, exposed1 = cm.exposed_comm(cm.ddp_buckets(grad), 2, NET, f * s)
    assert cm.predict(s, grad, 2, NET).step_time == pytest.approx(s + exposed1)  # default c = 1
    with pytest.raises(ValueError, match="compute_scale"):
        cm.predict(s, grad, 2, NET, compute_scale=0)


def test_latency_measured_between_compute_raises_latency_bound_steps() -> None:
    # a 27 KB single bucket: the step grows by 2(N-1)·(alpha_train - alpha_b2b) exactly
    b2b, train = cm.Network("b2b", 0.8e9, 150e-6), cm.Network("train", 0.8e9, 500e-6)
    p_b2b, p_train = (cm.predict(1e-3, 27688, 2, net) for net in (b2b, train))
    assert p_train.step_time - p_b2b.step_time == pytest.approx(2 * (500e-6 - 150e-6))


def test_sync_overhead_adds_per_step_at_n_only() -> None:
    # step(N) = s·c + o + exposed; o is DDP's own per-step work, absent on one device
    s, grad, o = 0.5e-3, 27688, 0.3e-3
    base = cm.predict(s, grad, 2, NET)
    p = cm.predict(s, grad, 2, NET, sync_overhead=o, batch_size=32)
    assert p.step_time == pytest.approx(base.step_time + o)
    assert p.exposed == base.exposed and p.comm_time == base.comm_time
    assert p.efficiency == pytest.approx(s / (base.step_time + o))
    assert p.throughput == pytest.approx(2 * 32 / (base.step_time + o))
    assert cm.predict(s, grad, 1, NET, sync_overhead=o).step_time == s
    with pytest.raises(ValueError, match="sync_overhead"):
        cm.predict(s, grad, 2, NET, sync_overhead=-1e-3)


def test_cost_model_imports_without_torch_or_the_benchmark_workloads() -> None:
    import subprocess
    import sys

    code = ("import sys, splitsync.tools.plan.costmodel; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'torch' or m.startswith('splitsync.bench')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
