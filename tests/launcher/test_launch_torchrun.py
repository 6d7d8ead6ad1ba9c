"""A script using splitsync.init() runs unchanged under python and under plain torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import SCRIPTS, env, ranks_in

pytestmark = pytest.mark.slow
INIT = str(SCRIPTS / "launch_init.py")


def test_under_python(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, INIT, str(tmp_path)], env=env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ranks_in(tmp_path) == {0}
    seen = json.loads((tmp_path / "rank_0").read_text())
    assert seen == {"world_size": 1, "launcher": "none", "local_rank": 0, "sum": 1.0}


def test_under_torchrun_standalone(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", INIT, str(tmp_path)],
                       env=env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    assert ranks_in(tmp_path) == {0, 1}
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank_{rank}").read_text())
        assert seen == {"world_size": 2, "launcher": "torchrun", "local_rank": rank, "sum": 2.0}
