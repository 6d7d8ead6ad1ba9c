"""What a fault-tolerant run is told: ``init(fault_tolerance=..., ft_...=)`` and the
variables the launcher (``splitsync run --replica-groups``) exports. Pure: no torchft here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FTOptions", "FAULT_TOLERANCE", "ft_options", "check_launch", "ENV_GROUP", "ENV_GROUPS",
           "ENV_LIGHTHOUSE", "TORCHFT_VERSION"]

FAULT_TOLERANCE = ("torchft",)
ENV_GROUP = "REPLICA_GROUP_ID"  # torchft's examples' convention (torchft itself reads neither)
ENV_GROUPS = "NUM_REPLICA_GROUPS"
ENV_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"  # read by torchft too
TORCHFT_VERSION = "0.2.0"  # the version this code was written and tested against


@dataclass(frozen=True)
class FTOptions:
    """One replica group's fault-tolerance settings."""

    group: int  # this process's replica group (REPLICA_GROUP_ID)
    groups: int  # replica groups in the job (NUM_REPLICA_GROUPS)
    lighthouse: str  # http://host:port of torchft's Lighthouse
    min_replicas: int = 1  # groups that must take part for a step to count
    heartbeat_ms: int = 100  # how often the group tells the Lighthouse it is alive
    timeout: float = 30.0  # seconds: a cross-group all-reduce, a commit vote, a live recovery
    quorum_timeout: float = 60.0  # seconds to wait for a quorum (must exceed the heartbeat timeout)

    @property
    def replica_id(self) -> str:
        """The group's id at the Lighthouse: zero-padded, since torchft orders replicas by it."""
        return f"g{self.group:05d}"


def _int(value: Any, name: str, low: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: {fix}")
    return value


def _env_int(environ: Mapping[str, str], key: str, default: int | None) -> int | None:
    text = environ.get(key)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{key}={text!r} is not a number: the launcher sets it to this "
                         "process's replica group (REPLICA_GROUP_ID) or the number of "
                         "groups (NUM_REPLICA_GROUPS).") from None


def ft_options(fault_tolerance: str, environ: Mapping[str, str], *, min_replicas: int = 1,
               heartbeat_ms: int = 100, timeout: float = 30.0,
               lighthouse: str | None = None) -> FTOptions:
    """``init(fault_tolerance=...)``'s settings checked, the group read from ``environ``."""
    if fault_tolerance not in FAULT_TOLERANCE:
        raise ValueError(f"fault_tolerance={fault_tolerance!r}: the one kind is 'torchft' "
                         "(or None for none).")
    _int(min_replicas, "ft_min_replicas", 1, "give the number of replica groups (>= 1) that "
         "must take part in a step for it to count.")
    _int(heartbeat_ms, "ft_heartbeat_ms", 1, "give the milliseconds between heartbeats "
         "(>= 1), e.g. 100.")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"ft_timeout={timeout!r}: give the seconds (> 0) a cross-group "
                         "all-reduce, commit or recovery may take, e.g. 30.")
    address = lighthouse or environ.get(ENV_LIGHTHOUSE, "")
    if not address:
        raise ValueError(
            "fault_tolerance='torchft' needs torchft's Lighthouse: launch with `splitsync run "
            "--replica-groups R -n N script.py` (it starts one on loopback), or set "
            f"{ENV_LIGHTHOUSE}=http://HOST:PORT (or init(ft_lighthouse=...)) to a running "
            "`torchft_lighthouse` (docs/fault-tolerance.md).")
    group = _env_int(environ, ENV_GROUP, 0)
    groups = _env_int(environ, ENV_GROUPS, None)
    if groups is None:
        raise ValueError(
            f"fault_tolerance='torchft': {ENV_GROUPS} is not set. `splitsync run "
            f"--replica-groups R` sets it (with {ENV_GROUP}); on a cluster export both for "
            "every group's job (docs/fault-tolerance.md).")
    assert group is not None
    if groups < 1 or not 0 <= group < groups:
        raise ValueError(f"{ENV_GROUP}={group} with {ENV_GROUPS}={groups}: groups are numbered "
                         f"0 to {groups - 1}.")
    if min_replicas > groups:
        raise ValueError(f"ft_min_replicas={min_replicas} is more than the {groups} replica "
                         f"group(s) of the job: no step could ever count.")
    return FTOptions(group=group, groups=groups, lighthouse=address, min_replicas=min_replicas,
                     heartbeat_ms=heartbeat_ms, timeout=float(timeout))


def check_launch(accumulate: int, launcher: str) -> None:
    """What a fault-tolerant run needs of the rest of init's settings and its launcher."""
    if accumulate != 1:
        raise ValueError(
            "fault_tolerance='torchft' takes accumulate=1 for now: each optimizer step is "
            "one quorum and one batch of the training loader.")
    if launcher not in ("torchrun", "env"):
        raise ValueError(
            "fault_tolerance='torchft' runs each replica group under torchrun's agent (its "
            "store is the group's): launch with `splitsync run --replica-groups R -n N "
            "script.py`, or with `splitsync run -n N` per group (docs/fault-tolerance.md).")
