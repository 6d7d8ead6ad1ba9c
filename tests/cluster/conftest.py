"""Fixtures for real launchers: a one-node SLURM, Open MPI's and MPICH's mpirun, and the
weights ``splitsync run -n 2`` ends with, which every other launcher must match bit for bit.

Each fixture skips, with the package to install, where its launcher is missing (CI's
.ci/run installs them from Debian's packages).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobkit import SCRIPT, job_env, python, run_job
from mpikit import Mpi, find_mpi
from slurmkit import Slurm, slurm_missing, start_slurm, stop_slurm

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # every test here starts a launcher and several processes
        if _HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """A running one-node SLURM (slurmkit), stopped after the session."""
    reason = slurm_missing()
    if reason is not None:
        pytest.skip(reason)
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        stop_slurm(cluster)


def _mpi(name: str) -> Mpi:
    found = find_mpi(name)
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def openmpi() -> Mpi:
    """Open MPI's mpirun, with what it needs to run as root on few cores."""
    return _mpi("openmpi")


@pytest.fixture(scope="session")
def mpich() -> Mpi:
    """MPICH's mpiexec (Hydra)."""
    return _mpi("mpich")


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What ``splitsync run -n 2 train_tiny.py`` writes: the weights to match."""
    out = tmp_path_factory.mktemp("reference")
    return run_job(python("-m", "splitsync", "run", "-n", "2", str(SCRIPT), str(out)), out,
                   job_env(), timeout=120)
