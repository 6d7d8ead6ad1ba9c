"""Parse launcher variables: integers and SLURM node lists, with errors that name the fix.

The lowest layer of the package (standard library only): ``env`` reads a process's
identity with it and ``launch.cluster`` reads a node's launch defaults with it, so both
accept and reject the same text in the same words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from splitsync.errors import EnvError

__all__ = ["EnvError", "env_int", "optional_int", "first_host", "slurm_nodelist",
           "slurm_tasks_per_node"]

# SLURM names the step's nodes first; the job's (and the legacy name) cover a bare sbatch.
SLURM_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def optional_int(env: Mapping[str, str], name: str, fix: str) -> int | None:
    """``env[name]`` as a non-negative integer; ``None`` when unset or blank.

    Raises EnvError naming the variable, its text and ``fix`` when it is not a whole
    number or is negative.
    """
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer. {fix}") from None
    if value < 0:
        raise EnvError(f"{name}={raw!r} is negative. {fix}")
    return value


def env_int(env: Mapping[str, str], name: str, fix: str, default: int | None = None) -> int:
    """Like :func:`optional_int`, but unset means ``default``, or an EnvError without one."""
    value = optional_int(env, name, fix)
    if value is not None:
        return value
    if default is None:
        raise EnvError(f"{name} is not set. {fix}")
    return default


def first_host(nodelist: str) -> str:
    """First host of a SLURM nodelist such as ``gpu[003-005,010],cpu1`` -> ``gpu003``."""
    nodelist = nodelist.strip()
    match = re.match(r"^([^,\[]+)(\[([^\]]+)\])?", nodelist)
    if not match:
        raise EnvError(f"SLURM_NODELIST={nodelist!r} cannot be parsed; set MASTER_ADDR instead.")
    prefix, _, ranges = match.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def slurm_nodelist(env: Mapping[str, str]) -> str | None:
    """The node list of this SLURM step or job, ``None`` outside an allocation."""
    return next((env[k] for k in SLURM_NODELIST_VARS if env.get(k)), None)


def slurm_tasks_per_node(name: str, text: str) -> tuple[int, ...]:
    """Tasks on each node from SLURM's compressed layout: ``2(x3),1`` -> ``(2, 2, 2, 1)``.

    ``name`` is the variable the text came from, for the error.
    """
    counts: list[int] = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if not match or (match.group(2) is not None and int(match.group(2)) < 1):
            raise EnvError(f"{name}={text!r} is not a SLURM task layout such as '2(x3),1'. "
                           "Run inside an srun step, or unset the SLURM_* variables.")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return tuple(counts)
