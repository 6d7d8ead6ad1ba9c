"""The bench harness: statistics, interleaving order, tables and a tiny in-process run."""

from __future__ import annotations

import json

import pytest

from splitsync.bench import harness
from splitsync.bench.measure import compare_loops
from splitsync.bench.report import render
from splitsync.bench.suite import plan_validation, scaling_rows


def test_median_percentile_and_ci() -> None:
    assert harness.median([3, 1, 2]) == 2
    assert harness.median([4, 1, 3, 2]) == 2.5
    assert harness.percentile([0, 10, 20, 30, 40], 90) == pytest.approx(36.0)
    lo, hi = harness.median_ci(list(range(100)))
    assert lo < 49.5 < hi and (lo, hi) == (40, 59)
    with pytest.raises(ValueError):
        harness.median([])


def test_interleave_rotates_and_alternates_order() -> None:
    log: list[str] = []

    def runner(name: str):
        def run(steps: int) -> list[float]:
            log.append(name)
            return [1.0] * steps
        return run

    blocks = harness.interleave({"A": runner("A"), "B": runner("B"), "C": runner("C")},
                                rounds=4, block=2, warmup=1)
    rounds = [log[i:i + 3] for i in range(0, len(log), 3)]
    assert rounds == [["A", "B", "C"], ["C", "B", "A"], ["B", "C", "A"], ["A", "C", "B"],
                      ["C", "A", "B"]]
    assert all(len(b) == 4 and all(len(x) == 2 for x in b) for b in blocks.values())


@pytest.mark.parametrize("n", [2, 3, 4])
def test_interleave_puts_every_loop_in_every_position_equally_often(n: int) -> None:
    # two loops included: rotating and reversing by the same parity would keep B second
    log: list[str] = []
    names = "ABCD"[:n]

    def runner(name: str):
        def run(steps: int) -> list[float]:
            log.append(name)
            return [1.0] * steps
        return run

    runners = {k: runner(k) for k in names}
    harness.interleave(runners, rounds=4 * n, block=1, warmup=0)
    rounds = [log[i:i + n] for i in range(0, len(log), n)]
    for name in names:
        where = [r.index(name) for r in rounds]
        assert sorted(where) == sorted(list(range(n)) * 4), (name, rounds)


def test_interleave_asks_for_more_rounds_up_to_max() -> None:
    asked: list[int] = []

    def more(done: int) -> bool:
        asked.append(done)
        return done < 5

    blocks = harness.interleave({"A": lambda n: [1.0] * n}, rounds=2, block=1, warmup=0,
                                max_rounds=10, more=more)
    assert len(blocks["A"]) == 5 and asked == [2, 3, 4, 5]


def test_ratio_is_median_of_paired_block_ratios_so_drift_cancels() -> None:
    # The machine slows down 3x over the run; B is always 10% slower than A in each round.
    drift = [1.0, 1.5, 2.0, 3.0, 3.0]
    blocks = {"A": [[d] * 5 for d in drift], "B": [[1.1 * d] * 5 for d in drift]}
    rows = {r.loop: r for r in harness.summarize(blocks, "A")}
    assert rows["B"].ratio == pytest.approx(1.1)
    assert rows["A"].ratio == 1.0 and rows["B"].rounds == 5 and rows["B"].steps == 25
    with pytest.raises(ValueError, match="baseline"):
        harness.summarize(blocks, "Z")


def test_round_order_is_what_interleave_runs() -> None:
    assert [harness.round_order(["A", "B"], r) for r in range(4)] == [
        ["A", "B"], ["B", "A"], ["B", "A"], ["A", "B"]]
    ran: list[str] = []
    harness.interleave({n: (lambda b, n=n: ran.append(n) or [0.0]) for n in "ABC"},
                       rounds=6, block=1, warmup=0)
    assert ran == [n for r in range(6) for n in harness.round_order(list("ABC"), r)]


def test_pooled_ratio_compares_all_steps_and_resamples_whole_rounds() -> None:
    base = [[1.0, 2.0, 3.0], [10.0, 11.0, 12.0]]  # a slow second round: drift, paired
    same = harness.pooled_ratio(base, base)
    assert same == (1.0, 1.0, 1.0)  # a round resampled is resampled for both loops
    slower = [[t * 1.01 for t in b] for b in base]
    ratio, lo, hi = harness.pooled_ratio(slower, base)
    assert ratio == pytest.approx(1.01) and lo == pytest.approx(1.01) and hi == pytest.approx(1.01)
    noisy = [[1.0, 1.2], [0.9, 1.1], [1.3, 0.8], [1.0, 1.05]]
    shifted = [[t + 0.02 * (-1) ** i for t in b] for i, b in enumerate(noisy)]
    ratio, lo, hi = harness.pooled_ratio(shifted, noisy)
    assert lo <= ratio <= hi and lo < hi
    assert harness.pooled_ratio(shifted, noisy) == (ratio, lo, hi)  # seeded
    with pytest.raises(ValueError, match="same number"):
        harness.pooled_ratio(base, base[:1])


def test_markdown_table_shape() -> None:
    text = harness.markdown_table(["a", "bb"], [[1, "x"], ["long", 2]])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[1].startswith("|-")
    assert len({len(line) for line in lines}) == 1


class _OneRankRun:
    """Just what compare_loops' splitsync loop needs from a Run, at world size 1."""

    def __init__(self) -> None:
        import splitsync

        self.run = splitsync.init(seed=0)

    def ctx(self) -> dict:
        r = self.run
        return {"run": r, "device": r.device, "rank": 0, "world_size": 1, "seed": r.seed}


def test_tiny_compare_loops_structure_and_identical_parameters() -> None:
    holder = _OneRankRun()
    try:
        res = compare_loops("W1", ["bare", "splitsync"], "bare", holder.ctx(), rounds=2,
                            block=3, warmup=1, optional=("accelerate",))
    finally:
        holder.run.close()
    assert res["workload"] == "W1" and res["world_size"] == 1 and res["baseline"] == "bare"
    rows = {r["loop"]: r for r in res["rows"]}
    assert set(rows) == {"bare", "splitsync", "accelerate"}
    for loop in ("bare", "splitsync"):
        r = rows[loop]
        assert r["steps"] == 6 and r["rounds"] == 2 and r["median_ms"] > 0
        assert r["max_param_diff"] == 0.0  # same init, same data order, same updates
        assert r["ratio_lo"] <= r["ratio"] <= r["ratio_hi"]
    assert rows["bare"]["ratio"] == 1.0
    assert "note" in rows["accelerate"] or rows["accelerate"].get("median_ms")
    table = render({"overhead": [res]})
    assert "| W1 " in table and "bare loop" in table and "splitsync" in table
    json.dumps(res)  # results.json-ready


def _fake_overhead(wl: str, n: int, ms: float, local: float | None = None,
                   ddp1: float | None = None) -> dict:
    rows = [{"loop": "splitsync", "median_ms": ms, "slowest_of_n_ms": ms}]
    if ddp1 is not None:
        rows += [{"loop": "bare", "median_ms": ms}, {"loop": "ddp1", "median_ms": ddp1}]
    if local is not None:
        rows.append({"loop": "local", "median_ms": local, "slowest_of_n_ms": 1.5 * local})
    return {"workload": wl, "world_size": n, "rows": rows}


def test_plan_validation_and_scaling_rows_from_results() -> None:
    from splitsync.tools.plan import costmodel as cm

    net = cm.Network("x", 1e9, 1e-4)
    comm = [{"bytes": b, "allreduce_s": cm.ring_allreduce_time(b, 2, net), "world_size": 2}
            for b in (1024, 1 << 20, 1 << 24)]
    overhead = [_fake_overhead("W1", 1, 1.0), _fake_overhead("W1", 2, 2.0, local=1.2)]
    val = plan_validation(overhead, comm)
    assert len(val) == 1 and val[0]["n"] == 2
    v = val[0]
    assert v["fit_bandwidth_GBps"] == pytest.approx(1.0) and v["fit_latency_us"] == pytest.approx(100)
    exposed = cm.predict(1.2e-3, v["grad_bytes"], 2, net).exposed
    assert v["predicted_ms"] == pytest.approx(1.2 + 1e3 * exposed)
    assert v["predicted_straggler_ms"] == pytest.approx(1.8 + 1e3 * exposed)
    assert v["error"] == pytest.approx(v["predicted_ms"] / 2.0 - 1)
    rows = scaling_rows(overhead, val)
    assert [r["n"] for r in rows] == [1, 2]
    assert rows[1]["efficiency"] == pytest.approx(0.5)
    assert rows[1]["samples_per_s"] == pytest.approx(2 * 32 / 2.0e-3)
    assert "plan" in render({"plan_validation": val, "scaling": rows})


def test_plan_validation_prefers_the_between_compute_fit() -> None:
    from splitsync.tools.plan import costmodel as cm

    fast, slow = cm.Network("b2b", 1e9, 1e-4), cm.Network("train", 1e9, 4e-4)
    sizes = (1024, 1 << 20, 1 << 24)
    comm = [{"bytes": b, "allreduce_s": cm.ring_allreduce_time(b, 2, fast), "world_size": 2}
            for b in sizes]
    # one sweep per workload, each with that workload's compute between the all-reduces
    other = cm.Network("other workload", 1e9, 9e-4)
    train = [{"bytes": b, "allreduce_s": cm.ring_allreduce_time(b, 2, net), "world_size": 2,
              "workload": wl, "gap_s": gap}
             for wl, net, gap in (("W1", slow, 1e-3), ("W2", other, 8e-3)) for b in sizes]
    overhead = [_fake_overhead("W1", 1, 1.0, ddp1=1.25), _fake_overhead("W1", 2, 2.0, local=1.2)]
    v = plan_validation(overhead, comm, train)[0]
    assert v["ddp_overhead_ms"] == pytest.approx(0.25)  # DDP on 1 process minus bare
    assert v["predicted_straggler_ms"] == pytest.approx(v["predicted_no_ddp_overhead_ms"] + 0.25)
    assert v["fit_latency_us"] == pytest.approx(400) and v["b2b_latency_us"] == pytest.approx(100)
    assert v["network_pattern"] == "between compute" and v["compute_gap_ms"] == pytest.approx(1)
    grad = v["grad_bytes"]
    assert v["predicted_straggler_ms"] == pytest.approx(
        1.8 + 0.25 + 1e3 * cm.predict(1.8e-3, grad, 2, slow).exposed)
    assert v["predicted_b2b_ms"] == pytest.approx(
        1.8 + 0.25 + 1e3 * cm.predict(1.8e-3, grad, 2, fast).exposed)
    assert v["predicted_b2b_ms"] < v["predicted_straggler_ms"]
    assert v["compute_scale"] == pytest.approx(1.8)
    same = cm.predict(1.0e-3, grad, 2, slow, compute_scale=v["compute_scale"],
                      sync_overhead=0.25e-3).step_time
    assert 1e3 * same == pytest.approx(v["predicted_straggler_ms"])
    assert "back-to-back fit" in render({"plan_validation": [v]})


def test_train_rounds_fill_the_budget_within_bounds() -> None:
    from splitsync.bench.measure import train_rounds

    assert train_rounds(10e-3, 5) == int(1.5 / (5 * 11e-3))  # 27 rounds of 5 sizes
    assert train_rounds(1e-4, 5) == 100 and train_rounds(1.0, 5) == 20
