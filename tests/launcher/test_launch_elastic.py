"""Elastic membership: with --nnodes 1:2, losing a node leaves the other training alone.

Two `splitsync run --nnodes 1:2` agents on loopback form a world of 2. Node 1 (agent and
workers) is killed, as when a machine disappears; node 0's worker fails on the broken
collective, its agent restarts it, the c10d rendezvous completes with node 0 alone, and the
worker resumes from the latest checkpoint at world size 1 and finishes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from launch_helpers import SCRIPTS, endpoint_port, env, stop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(330)]  # above the waits below
ELASTIC = str(SCRIPTS / "launch_elastic.py")
STEPS = 24


def _node(rank: int, port: int, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "splitsync", "run", "--nnodes", "1:2", "--node-rank", str(rank),
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic", "--rdzv-timeout", "120",
         "--rdzv-conf", "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2",
         "--max-restarts", "2", "--monitor-interval", "0.2", "-n", "1", ELASTIC, str(out),
         str(STEPS)],
        env=env(NODE_TAG=f"node{rank}", OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _progress(out: Path) -> list[tuple[int, int, int, int]]:
    path = out / "progress"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [tuple(int(v) for v in row) for row in rows if len(row) == 4]  # type: ignore[misc]


def _kill_node(proc: subprocess.Popen[str], out: Path, tag: str) -> None:
    proc.send_signal(signal.SIGKILL)  # the agent: no chance to clean up
    for pid_file in out.glob(f"pid_{tag}_*"):  # its workers run in their own sessions
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@pytest.mark.extended  # two launches and a node lost; the multinode launch stays
def test_losing_a_node_continues_at_world_size_one_from_the_checkpoint(tmp_path: Path) -> None:
    port = endpoint_port()
    node1 = _node(1, port, tmp_path)  # first: it waits for node 0, so both join one round
    time.sleep(2)
    node0 = _node(0, port, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait for a few steps at world size 2
            if sum(1 for row in _progress(tmp_path) if row[1] == 2) >= 6:
                break
            assert node0.poll() is None and node1.poll() is None, "a node ended early"
            time.sleep(0.2)
        else:
            pytest.fail("the two nodes never trained together at world size 2")
        _kill_node(node1, tmp_path, "node1")
        node1.wait(timeout=30)
        output = node0.communicate(timeout=150)[0]
    finally:
        for proc in (node0, node1):
            stop(proc)
    assert node0.returncode == 0, output

    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final["steps"] == STEPS and final["world_size"] == 1
    assert final["restart_count"] >= 1
    assert 0 < final["resumed_from"] < STEPS  # resumed from a checkpoint, not from scratch
    assert all(torch.isfinite(v).all() for v in final["model"].values())
    rows = _progress(tmp_path)
    before = max(step for restart, world, _, step in rows if world == 2)
    after = [step for restart, world, _, step in rows if world == 1]
    assert min(after) == final["resumed_from"] + 1
    # the checkpoint may be one step ahead of the last progress line of a killed rank 0
    assert final["resumed_from"] <= before + 1
    assert max(after) == STEPS
