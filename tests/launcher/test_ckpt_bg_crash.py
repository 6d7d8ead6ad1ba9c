"""SIGKILL of either rank inside a background save (staging, writing, committing), under
`splitsync run --max-restarts N`, for DDP and FSDP2: the job resumes from the last complete
checkpoint and ends bit-equal to an uninterrupted run of the same strategy.

Launches are shared: one launch goes through several kills, one per attempt (attempt k is
killed at the k-th point and restarted), and the last attempt runs to the end.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ckpt_bg_crash_script import spawn_entry
from launchkit import launch_anew, launch_command
from safetensors.torch import load_file

from splitsync.testing import clean_env, spawn

SCRIPT = Path(__file__).with_name("ckpt_bg_crash_script.py")
_CLEAN: dict[str, dict[str, torch.Tensor]] = {}


def uninterrupted(strategy: str, base: Path) -> dict[str, torch.Tensor]:
    """The same script, never killed, saving in the background every 2 steps to the end."""
    if strategy not in _CLEAN:
        d = base / f"clean-{strategy}"
        spawn(spawn_entry, 2, str(d / "ck"), str(d / "clean.safetensors"), strategy,
              timeout=120)
        _CLEAN[strategy] = load_file(d / "clean.safetensors")
    return _CLEAN[strategy]


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize(("strategy", "kills"), [
    # the suite: the acceptance case (--max-restarts 1); the extended trials: every point
    pytest.param("ddp", "0:writing", marks=pytest.mark.extended),
    ("fsdp", "1:staging"),
    pytest.param("ddp", "1:staging,0:writing,1:writing,0:commit,1:commit",
                 marks=pytest.mark.extended),
    pytest.param("fsdp", "0:staging,1:writing,0:writing,0:commit,1:commit",
                 marks=pytest.mark.extended),
])
def test_rank_killed_inside_background_save(tmp_path: Path, strategy: str, kills: str,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    clean = uninterrupted(strategy, tmp_path_factory.getbasetemp())
    env = clean_env()
    env["SPLITSYNC_TEST_KILL"] = kills
    env["SPLITSYNC_TEST_STRATEGY"] = strategy
    restarts = len(kills.split(","))
    proc, folder = launch_anew(
        lambda d: launch_command(SCRIPT, 2, str(d / "ck"), str(d / "crashed.safetensors"),
                                 max_restarts=restarts),
        tmp_path, env=env, timeout=400)
    out = folder / "crashed.safetensors"
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    # every attempt but the last was killed in the save of step 6 ("1:commit", always last,
    # may find step 6 committed by rank 0 just before rank 1 died)
    assert f"restart {restarts}: resumed at step " in log, log
    assert "ended at 12" in log, log
    got = load_file(out)
    assert got.keys() == clean.keys()
    assert all(torch.equal(got[k], clean[k]) for k in got)
