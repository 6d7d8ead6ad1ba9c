"""``init(fault_tolerance=...)``: the settings and the launcher's variables are checked before
anything starts, each refusal naming the fix; torchft is needed only when a run asks for it."""

from __future__ import annotations

import pytest

import splitsync as ss
from splitsync.ft.manager import on_loopback
from splitsync.ft.options import ft_options

ENV = {"TORCHFT_LIGHTHOUSE": "http://127.0.0.1:1", "REPLICA_GROUP_ID": "1",
       "NUM_REPLICA_GROUPS": "3"}


def test_the_group_and_the_lighthouse_come_from_the_environment() -> None:
    o = ft_options("torchft", ENV, min_replicas=2)
    assert (o.group, o.groups, o.min_replicas, o.lighthouse) == (1, 3, 2, "http://127.0.0.1:1")
    assert o.replica_id == "g00001"  # zero-padded: torchft orders groups by it


@pytest.mark.parametrize(("env", "kw", "match"), [
    ({**ENV, "TORCHFT_LIGHTHOUSE": ""}, {}, "Lighthouse"),
    ({k: v for k, v in ENV.items() if k != "NUM_REPLICA_GROUPS"}, {}, "NUM_REPLICA_GROUPS"),
    ({**ENV, "REPLICA_GROUP_ID": "3"}, {}, "numbered 0 to 2"),
    ({**ENV, "REPLICA_GROUP_ID": "x"}, {}, "not a number"),
    (ENV, {"min_replicas": 4}, "no step could ever count"),
    (ENV, {"min_replicas": 0}, "ft_min_replicas"),
    (ENV, {"heartbeat_ms": 0}, "ft_heartbeat_ms"),
    (ENV, {"timeout": -1}, "ft_timeout"),
])
def test_bad_settings_are_refused_by_name(env: dict[str, str], kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ft_options("torchft", env, **kw)


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="'torchft'"):
        ft_options("elastic", ENV)


def test_init_refuses_a_process_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match="--replica-groups"):
        ss.init(fault_tolerance="torchft")


def test_loopback_addresses() -> None:
    assert on_loopback("http://127.0.0.1:29510") and on_loopback("localhost:1")
    assert on_loopback("http://[::1]:5") and not on_loopback("http://node3:29510")
