"""Shared test settings: single-threaded BLAS so multi-rank tests do not fight for cores.

Every test under tests/distributed/ starts a process group, so it is in the slow tier
(``-m slow``) whether or not it says so; ``-m "not slow"`` runs the pure and single-process
tests.
"""

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

_DISTRIBUTED = Path(__file__).parent / "distributed"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _DISTRIBUTED in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.slow)
