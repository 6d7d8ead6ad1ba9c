"""`splitsync bench` and `splitsync plan` end to end (tiny runs; timings never asserted).

`plan` without measurements never imports torch, so it runs as a fresh process. The cases
that import torch call the same command line in this interpreter (``_here``): their ranks
come from the fork server, which a fresh process would have to start (and import torch) again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from splitsync.testing import clean_env


def _cli(*args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run([sys.executable, "-m", "splitsync", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _here(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``splitsync ARGS`` in this process; a usage error is exit code 2, as from the shell."""
    from splitsync.cli import main

    capsys.readouterr()
    message = ""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse, or a message the interpreter would print
        code = exc.code if isinstance(exc.code, int) else 1
        message = "" if exc.code is None or isinstance(exc.code, int) else f"{exc.code}\n"
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["splitsync", *args], code, out, err + message)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiny_run_writes_tables_json_and_plots(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "res"
    p = _here(capsys, "bench", "--quick", "--sections", "overhead,naive,comm,scaling",
              "--workloads", "W1", "--procs", "1,2", "--rounds", "2", "--block", "2",
              "--no-optional", "--out", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| W1 " in p.stdout and "hand-written DDP" in p.stdout and "bare loop" in p.stdout
    assert "naive all_reduce" in p.stdout and "All-reduce bandwidth" in p.stdout
    res = json.loads((out / "results.json").read_text())
    assert {o["world_size"] for o in res["overhead"]} == {1, 2}
    two = next(o for o in res["overhead"] if o["world_size"] == 2)
    loops = {r["loop"]: r for r in two["rows"]}
    assert set(loops) == {"hand", "splitsync", "local"}
    assert loops["hand"]["ratio"] == 1.0 and loops["splitsync"]["steps"] == 4
    assert loops["splitsync"]["max_param_diff"] == 0.0  # same final parameters as hand DDP
    assert [c["bytes"] for c in res["comm"]] == [1024, 65536, 1024**2, 16 * 1024**2]
    assert res["plan_validation"][0]["n"] == 2 and "predicted_ms" in res["plan_validation"][0]
    # the measured model terms: DDP on a 1-process group, all-reduces between compute
    one = next(o for o in res["overhead"] if o["world_size"] == 1)
    assert "ddp1" in {r["loop"] for r in one["rows"]}
    assert res["plan_validation"][0]["ddp_overhead_ms"] is not None
    assert res["plan_validation"][0]["network_pattern"] == "between compute"
    assert {c["workload"] for c in res["comm_train"]} == {"W1"}
    assert [s["n"] for s in res["scaling"]] == [1, 2]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert {"overhead.png", "allreduce.png", "scaling.png", "naive_vs_ddp.png"} <= {
        f.name for f in out.iterdir()}


def test_bench_rejects_unknown_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _here(capsys, "bench", "--sections", "overhead,speed", "--out", str(tmp_path))
    assert p.returncode != 0 and "unknown section" in p.stderr and "speed" in p.stderr


def test_plan_json_predictions() -> None:
    p = _cli("plan", "--params", "124M", "--step-ms", "180", "--network", "ib-400g",
             "--batch-size", "16", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["params"] == 124_000_000 and res["grad_bytes"] == 496_000_000
    assert [r["n"] for r in res["predictions"]] == [1, 2, 8, 64, 512, 4096]
    first = res["predictions"][0]
    assert first["efficiency"] == 1.0 and first["throughput"] == pytest.approx(16 / 0.18)
    assert res["advice"]


def test_plan_compute_scale_and_ddp_overhead_flags() -> None:
    from splitsync.tools.plan import costmodel as cm

    args = ("plan", "--params", "7k", "--step-ms", "0.5", "--sizes", "1,2", "--network",
            "eth-10g", "--json")
    p = _cli(*args, "--compute-scale", "1.5", "--ddp-overhead-ms", "0.3")
    assert p.returncode == 0, p.stderr
    two = json.loads(p.stdout)["predictions"][1]
    want = cm.predict(0.5e-3, 28_000, 2, cm.NETWORKS["eth-10g"], compute_scale=1.5,
                      sync_overhead=0.3e-3)
    assert two["step_time_s"] == pytest.approx(want.step_time)
    bad = _cli(*args, "--ddp-overhead-ms", "-1")
    assert bad.returncode != 0 and "--ddp-overhead-ms" in bad.stderr
    bad = _cli(*args, "--compute-scale", "0")
    assert bad.returncode != 0 and "--compute-scale" in bad.stderr


def test_plan_table_and_errors() -> None:
    p = _cli("plan", "--params", "7B", "--dtype", "bf16", "--step-ms", "900", "--network",
             "eth-100g", "--memory-gb", "80")
    assert p.returncode == 0, p.stderr
    assert "| 4096 " in p.stdout and "FSDP" in p.stdout and "compression" in p.stdout
    bad = _cli("plan", "--params", "7B", "--step-ms", "900", "--network", "carrier-pigeon")
    assert bad.returncode != 0 and "carrier-pigeon" in bad.stderr and "nvlink4" in bad.stderr
    none = _cli("plan", "--step-ms", "900")
    assert none.returncode != 0 and "--params" in none.stderr


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_plan_measures_model_step_and_local_network(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plan_tinynet.py").write_text(
        "from torch import nn\n"
        "def make():\n"
        "    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    p = _here(capsys, "plan", "--model", "plan_tinynet:make", "--measure", "--input-shape", "16",
              "--batch-size", "8", "--network", "measured", "--sizes", "1,2", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res["params"] == 16 * 32 + 32 + 32 * 4 + 4 and res["grad_bytes"] == 4 * res["params"]
    assert res["step_time_s"] > 0 and res["network"]["name"].startswith("measured")
    assert res["network"]["bandwidth"] > 0 and [r["n"] for r in res["predictions"]] == [1, 2]
