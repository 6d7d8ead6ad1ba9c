"""Option validation and torchrun argv building for ``splitsync run`` (no processes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from torch.distributed.run import parse_args as torchrun_parse

from splitsync.launch.argv import torchrun_argv, torchrun_command
from splitsync.launch.cluster import ClusterDefaults
from splitsync.launch.spec import LaunchError, build_spec, parse_endpoint, parse_nnodes, parse_nproc


@pytest.fixture()
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def spec_for(script: str, **kw):
    kw.setdefault("environ", {})
    kw.setdefault("cores", 8)
    return build_spec(script=script, **kw)


def test_parse_nnodes() -> None:
    assert parse_nnodes("2") == (2, 2)
    assert parse_nnodes("1:4") == (1, 4)
    for bad in ("3:2", "0", "0:2", "a", "1:2:3", ""):
        with pytest.raises(LaunchError, match="--nnodes"):
            parse_nnodes(bad)


def test_parse_nproc() -> None:
    assert parse_nproc("auto", 0) == 1
    assert parse_nproc("auto", 4) == 4
    assert parse_nproc("3", 8) == 3
    with pytest.raises(LaunchError, match="at least one process"):
        parse_nproc("0", 0)
    with pytest.raises(LaunchError, match="not a number"):
        parse_nproc("two", 0)


def test_parse_endpoint() -> None:
    assert parse_endpoint("node0:29401") == ("node0", 29401)
    assert parse_endpoint("node0") == ("node0", 29400)
    assert parse_endpoint("[::1]:1234") == ("::1", 1234)
    for bad in (":80", "node0:0", "node0:70000", "node0:http", ""):
        with pytest.raises(LaunchError, match="--rdzv-endpoint"):
            parse_endpoint(bad)


def test_missing_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="script 'nope.py' not found"):
        spec_for("nope.py")


def test_multi_node_needs_endpoint(script: str) -> None:
    with pytest.raises(LaunchError, match="needs --rdzv-endpoint"):
        spec_for(script, nnodes="2")


def test_node_rank_must_fit(script: str) -> None:
    with pytest.raises(LaunchError, match="--node-rank 2"):
        spec_for(script, nnodes="2", node_rank=2, rdzv_endpoint="h:1")


def test_bad_numbers(script: str) -> None:
    with pytest.raises(LaunchError, match="--max-restarts"):
        spec_for(script, max_restarts=-1)
    with pytest.raises(LaunchError, match="--rdzv-timeout"):
        spec_for(script, rdzv_timeout=0)
    with pytest.raises(LaunchError, match="--rdzv-conf"):
        spec_for(script, rdzv_conf="oops")


def test_single_node_argv_is_loopback_c10d(script: str) -> None:
    spec = replace(spec_for(script, nproc="2", script_args=["-n", "5", "--dry-run"]),
                   rdzv_port=4321)
    argv = torchrun_argv(spec)
    parsed = torchrun_parse(argv)  # torchrun's own parser accepts it
    assert parsed.rdzv_backend == "c10d"
    assert parsed.rdzv_endpoint == "127.0.0.1:4321"
    assert parsed.local_addr == "127.0.0.1"
    assert parsed.nnodes == "1" and parsed.nproc_per_node == "2"
    assert parsed.training_script == script
    assert parsed.training_script_args == ["-n", "5", "--dry-run"]
    assert "join_timeout=600" in parsed.rdzv_conf


def test_omp_threads_set_and_said_once(script: str) -> None:
    spec = spec_for(script, nproc="2", cores=8)
    assert dict(spec.env)["OMP_NUM_THREADS"] == "4"
    assert len(spec.notes) == 1 and "OMP_NUM_THREADS=4" in spec.notes[0]
    kept = spec_for(script, nproc="2", environ={"OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in dict(kept.env) and kept.notes == ()


def test_multi_node_argv(script: str) -> None:
    spec = spec_for(script, nproc="1", nnodes="1:2", node_rank=1,
                    rdzv_endpoint="node0:29500", rdzv_id="job9", rdzv_timeout=30,
                    rdzv_conf="last_call_timeout=2", max_restarts=3)
    parsed = torchrun_parse(torchrun_argv(spec))
    assert parsed.nnodes == "1:2" and parsed.rdzv_endpoint == "node0:29500"
    assert parsed.rdzv_id == "job9" and parsed.max_restarts == 3
    conf = dict(p.split("=") for p in parsed.rdzv_conf.split(","))
    assert conf == {"join_timeout": "30", "read_timeout": "30", "is_host": "false",
                    "last_call_timeout": "2"}
    assert parsed.local_addr is None  # a real network: torchrun finds this node's address
    assert "GLOO_SOCKET_IFNAME" not in dict(spec.env)


def test_cluster_defaults_fill_in_but_command_line_wins(script: str) -> None:
    cluster = ClusterDefaults("slurm", nnodes="2", node_rank=1, endpoint="gpu003:29400",
                              rdzv_id="slurm-5")
    spec = spec_for(script, cluster=cluster)
    assert (spec.min_nodes, spec.max_nodes, spec.node_rank, spec.endpoint, spec.rdzv_id,
            spec.source) == (2, 2, 1, "gpu003:29400", "slurm-5", "slurm")
    spec = spec_for(script, cluster=cluster, nnodes="3", node_rank=2, rdzv_endpoint="x:1")
    assert (spec.max_nodes, spec.node_rank, spec.endpoint) == (3, 2, "x:1")


def test_dry_run_command_is_shell_quoted(script: str) -> None:
    spec = replace(spec_for(script, script_args=["a b", "--x=1"]), rdzv_port=1111)
    cmd = torchrun_command(spec)
    assert cmd.startswith("OMP_NUM_THREADS=8 ")
    assert "torchrun --nnodes 1 --nproc-per-node 1" in cmd
    assert cmd.endswith("'a b' --x=1")
