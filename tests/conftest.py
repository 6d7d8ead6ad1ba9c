"""Shared test settings: single-threaded BLAS so multi-rank tests do not fight for cores;
the benchmark models on the import path.

Every test under tests/distributed/ starts a process group, so it is in the slow tier
(``-m slow``) whether or not it says so; ``-m "not slow"`` runs the pure and single-process
tests.

The default run (``addopts`` in pyproject.toml) leaves out the ``extended`` trials: the
longer randomized, preemption, launcher and cluster cases beyond the suite's representative
sample. ``.ci/run`` runs them after the README's command (``-m extended``). An extended test
is slow too, so that ``-m "not slow"`` (which replaces the default ``-m``) still leaves it out.
"""

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

# The benchmark models (benchmarks/gpt.py, benchmarks/memmodels.py) live beside the benchmark
# scripts, outside the wheel; the tests of their formulas import them from there.
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))

_DISTRIBUTED = Path(__file__).parent / "distributed"


_CLUSTER = Path(__file__).parent / "cluster"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _CLUSTER in Path(str(item.path)).parents:
            # one worker for every cluster test (the suite runs on two, pyproject.toml): two
            # one-node SLURMs at once both number their first job 1, and derive one port
            item.add_marker(pytest.mark.xdist_group("cluster"))
        if _DISTRIBUTED in Path(str(item.path)).parents \
                or item.get_closest_marker("extended") is not None:
            item.add_marker(pytest.mark.slow)
