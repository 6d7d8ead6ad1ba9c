"""Several "nodes" on one machine: two `splitsync run --nnodes 2 -n 1` on loopback.

The reference they are compared with (the same script on one node, two processes) is not
what is tested, so it runs on two ranks from the fork server (``launchkit.run_ranks``),
not through a third launcher.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from launch_helpers import SCRIPTS, endpoint_port, env, ranks_in, splitsync, stop
from launchkit import run_ranks

from splitsync.distributed.group import free_port

pytestmark = pytest.mark.slow
TRAIN = str(SCRIPTS / "launch_train.py")


def _node(rank: int, port: int, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "splitsync", "run", "--nnodes", "2", "--node-rank", str(rank),
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
         "--rdzv-timeout", "120", "-n", "1", TRAIN, str(out)],
        env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(300)  # above the 200 s the processes get, so they are always killed
def test_two_nodes_on_loopback_train_like_one_node_with_two_processes(tmp_path: Path) -> None:
    two_nodes, one_node = tmp_path / "two_nodes", tmp_path / "one_node"
    two_nodes.mkdir()
    one_node.mkdir()
    port = endpoint_port()
    # node 1 first: it waits for node 0; the single-node reference runs meanwhile
    procs = [_node(1, port, two_nodes), _node(0, port, two_nodes)]
    deadline = time.monotonic() + 200
    try:
        run_ranks(TRAIN, 2, str(one_node), timeout=150)
        outputs = [p.communicate(timeout=max(1, deadline - time.monotonic()))[0] for p in procs]
    finally:
        for p in procs:
            stop(p)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    assert ranks_in(two_nodes) == {0, 1}
    assert {(two_nodes / f"rank_{r}").read_text().split()[0] for r in (0, 1)} == {"2"}
    a = torch.load(two_nodes / "params.pt", weights_only=True)
    b = torch.load(one_node / "params.pt", weights_only=True)
    assert a["world_size"] == b["world_size"] == 2
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        torch.testing.assert_close(a["state"][key], b["state"][key], rtol=0, atol=1e-6)
    torch.manual_seed(0)  # the script's model is created right after seeding with 0
    start = torch.nn.Linear(4, 1)
    assert not torch.equal(a["state"]["weight"], start.weight.detach())  # it did train


def test_wrong_rdzv_endpoint_fails_clearly_within_the_timeout(tmp_path: Path) -> None:
    port = free_port()  # nobody listens there
    r = splitsync("run", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                  f"127.0.0.1:{port}", "--rdzv-timeout", "3", "-n", "1", TRAIN, str(tmp_path),
                  timeout=90)
    assert r.returncode != 0
    assert f"host 127.0.0.1 port {port}" in r.stderr and "--rdzv-timeout 3s" in r.stderr
    assert "Traceback" not in r.stderr
    assert not ranks_in(tmp_path)


def test_unresolvable_rdzv_host_is_named(tmp_path: Path) -> None:
    r = splitsync("run", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                  "no-such-host.invalid:29400", "--rdzv-timeout", "2", "-n", "1", TRAIN,
                  str(tmp_path), timeout=90)
    assert r.returncode != 0
    assert "host no-such-host.invalid port 29400" in r.stderr
    assert "does not resolve" in r.stderr
