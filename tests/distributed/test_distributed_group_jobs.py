"""The store of srun/mpirun jobs: on loopback only, and never shared by two jobs.

Two jobs that end up on one port (a fixed MASTER_PORT, or two job ids that hash alike) must
fail with the port named, not train as one group.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from splitsync.distributed.env import DistEnv
from splitsync.distributed.group import GroupError, _store, destroy_group, free_port, init_group
from splitsync.testing import spawn

TIMEOUT = timedelta(seconds=60)


def _job(rank: int, world: int, job: str, port: int) -> DistEnv:
    return DistEnv(launcher="openmpi", rank=rank, world_size=world, local_rank=rank,
                   local_world_size=world, master_port=port, job_id=job, port_derived=True)


def _join(rank: int, world: int, job: str, port: int) -> str:
    try:
        init_group(_job(rank, world, job, port), "gloo", torch.device("cpu"), TIMEOUT)
    except GroupError as exc:
        return str(exc)
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
    destroy_group()
    return f"trained {total.item():.0f}"


def _listen_addresses(port: int) -> set[str]:
    """Local addresses listening on ``port``, from Linux's /proc/net/tcp and tcp6 (IPv4 as
    dotted quads, IPv6 as their raw hex: any IPv6 listener is a failure here)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if int(hexport, 16) != port or state != "0A":  # 0A: LISTEN
                continue
            found.add(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))
                      if len(addr) == 8 else addr)
    return found


def test_a_job_forms_its_group_through_its_own_store() -> None:
    port = free_port()
    assert spawn(_join, 3, "openmpi-B", port, timeout=120) == ["trained 3"] * 3


def test_second_job_on_a_taken_port_fails_and_never_joins_the_first() -> None:
    port = free_port()
    first = _store(_job(0, 2, "openmpi-A", port), TIMEOUT)  # job A's rank 0 holds the port
    try:
        out = spawn(_join, 2, "openmpi-B", port, timeout=120)
    finally:
        del first
    assert f"MASTER_PORT={port} is already in use" in out[0]
    assert "derived from openmpi job openmpi-B" in out[0]
    assert "rendezvous of another job (openmpi-A)" in out[1]
    assert "MASTER_PORT" in out[1]


def test_loopback_store_listens_on_loopback_only() -> None:
    try:
        open("/proc/net/tcp").close()
    except OSError:
        pytest.skip("no /proc/net/tcp on this system")
    port = free_port()
    store = _store(_job(0, 2, "openmpi-C", port), TIMEOUT)
    try:
        assert _listen_addresses(port) == {"127.0.0.1"}
    finally:
        del store
