"""A script using splitsync.init() runs unchanged under python and under plain torchrun.

Under python it runs in this interpreter (``launchkit.run_here``: no launcher variables,
the script as ``__main__``): a fresh interpreter would only import torch once more.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from launch_helpers import SCRIPTS, env, ranks_in
from launchkit import launch_anew, run_here

pytestmark = pytest.mark.slow
INIT = str(SCRIPTS / "launch_init.py")


def test_under_python(tmp_path: Path) -> None:
    run_here(INIT, str(tmp_path))
    assert ranks_in(tmp_path) == {0}
    seen = json.loads((tmp_path / "rank_0").read_text())
    assert seen == {"world_size": 1, "launcher": "none", "local_rank": 0, "sum": 1.0}


def test_under_torchrun_standalone(tmp_path: Path) -> None:
    r, _ = launch_anew(lambda _: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc-per-node", "2", INIT, str(tmp_path)],
                       tmp_path / "launches", env=env(OMP_NUM_THREADS="1"), timeout=180)
    assert r.returncode == 0, r.stderr
    assert ranks_in(tmp_path) == {0, 1}
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank_{rank}").read_text())
        assert seen == {"world_size": 2, "launcher": "torchrun", "local_rank": rank, "sum": 2.0}
