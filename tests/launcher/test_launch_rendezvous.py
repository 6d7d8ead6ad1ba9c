"""Holding the rendezvous port and probing the endpoint (sockets only, no workers)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from splitsync.distributed.group import free_port
from splitsync.launch.rendezvous import reserve_endpoint, wait_for_endpoint
from splitsync.launch.spec import LaunchError, build_spec


@pytest.fixture()
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("")
    return str(path)


def test_single_node_holds_a_loopback_port_until_the_end(script: str) -> None:
    spec = build_spec(script=script, environ={})
    with reserve_endpoint(spec) as ready:
        assert ready.rdzv_port > 0
        with socket.create_connection(("127.0.0.1", ready.rdzv_port), timeout=5):
            pass  # the store accepts connections on loopback
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", ready.rdzv_port))


def test_second_node_rank_0_on_a_busy_port_is_refused(script: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        spec = build_spec(script=script, environ={}, nnodes="2", node_rank=0,
                          rdzv_endpoint=f"127.0.0.1:{port}")
        with pytest.raises(LaunchError, match=f"port {port} on 127.0.0.1 is already in use"):
            with reserve_endpoint(spec):
                pass


def test_node_without_rank_joins_when_the_port_is_hosted(script: str) -> None:
    with socket.socket() as host:
        host.bind(("127.0.0.1", 0))
        host.listen(4)
        port = host.getsockname()[1]
        spec = build_spec(script=script, environ={}, nnodes="2",
                          rdzv_endpoint=f"127.0.0.1:{port}", rdzv_timeout=5)
        with reserve_endpoint(spec) as ready:
            assert ready.rdzv_port == port


def test_probe_gives_up_at_the_timeout_naming_host_and_port(script: str) -> None:
    port = free_port()
    spec = build_spec(script=script, environ={}, nnodes="2", node_rank=1,
                      rdzv_endpoint=f"127.0.0.1:{port}", rdzv_timeout=1)
    with pytest.raises(LaunchError, match=f"host 127.0.0.1 port {port} within --rdzv-timeout 1s"):
        wait_for_endpoint(spec)
