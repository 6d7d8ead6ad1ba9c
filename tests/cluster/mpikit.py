"""Find the mpirun of Open MPI and of MPICH, however Debian's alternatives point.

Debian installs both side by side: ``mpirun.openmpi`` (orterun) and ``mpirun.mpich``
(Hydra's mpiexec), with ``mpirun``/``mpiexec`` pointing at one of them through
/etc/alternatives. Each candidate is asked for its version, so a name that leads to the
other MPI is never taken. Debian: ``apt-get install openmpi-bin mpich``.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Mpi", "find_mpi", "MPIS"]

MPIS = ("openmpi", "mpich")
# Debian's own names first, then its per-architecture folders, then whatever the
# alternatives chose for the generic names.
_NAMES = {
    "openmpi": (("mpirun.openmpi", "mpiexec.openmpi"), "/usr/lib/*/openmpi/bin/mpirun",
                ("orterun", "prterun", "mpirun", "mpiexec")),
    "mpich": (("mpirun.mpich", "mpiexec.mpich", "mpiexec.hydra"),
              "/usr/lib/*/mpich/bin/mpiexec", ("mpirun", "mpiexec")),
}


def _candidates(name: str) -> list[str]:
    own, folder, generic = _NAMES[name]
    return [*own, *sorted(glob.glob(folder)), *generic]
# What `--version` prints: "mpirun (Open MPI) 4.1.4" / "mpirun.openmpi (OpenRTE) 4.1.4";
# "HYDRA build details: ..." for MPICH (and Intel MPI, also Hydra).
_SIGNATURE = {"openmpi": ("Open MPI", "OpenRTE"), "mpich": ("HYDRA",)}
_INSTALL = {"openmpi": "openmpi-bin", "mpich": "mpich"}


@dataclass(frozen=True)
class Mpi:
    """One MPI's launcher and the options it needs to start ranks here."""

    name: str
    mpirun: str
    options: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def command(self, n: int, *argv: str) -> list[str]:
        """``mpirun -n N argv...``."""
        return [self.mpirun, *self.options, "-n", str(n), *argv]


def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout + out.stderr


def find_mpi(name: str) -> Mpi | str:
    """The launcher of ``name`` ("openmpi" or "mpich"), or why there is none."""
    seen: set[str] = set()
    for candidate in _candidates(name):
        path = shutil.which(candidate)
        if path is None or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        if any(sig in _version(path) for sig in _SIGNATURE[name]):
            return _options(name, path)
    return f"{name} is not installed (no mpirun of it found): apt-get install {_INSTALL[name]}"


def _options(name: str, path: str) -> Mpi:
    if name != "openmpi":
        return Mpi(name, path)
    # Open MPI refuses root unless told twice; a small CI machine may have fewer cores
    # than ranks, which Open MPI refuses too unless oversubscription is allowed.
    env = ({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
           if os.geteuid() == 0 else {})
    return Mpi(name, path, ("--oversubscribe",), env)
