"""SIGKILL of either rank inside a background save, under `splitsync run --max-restarts 1`:
the job resumes from the last complete checkpoint and ends bit-equal to an uninterrupted run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from ckpt_crash_script import spawn_entry
from launchkit import launch_command
from safetensors.torch import load_file

from splitsync.testing import clean_env, spawn

SCRIPT = Path(__file__).with_name("ckpt_bg_crash_script.py")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    d = tmp_path_factory.mktemp("clean")
    spawn(spawn_entry, 2, str(d / "ck"), str(d / "clean.safetensors"), timeout=90)
    return load_file(d / "clean.safetensors")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kill", ["1:staging", "0:writing", "1:writing", "0:commit",
                                  "1:commit"])
def test_rank_killed_inside_background_save(tmp_path: Path, kill: str,
                                             uninterrupted: dict[str, torch.Tensor]) -> None:
    out = tmp_path / "crashed.safetensors"
    env = clean_env()
    env["SPLITSYNC_TEST_KILL"] = kill
    cmd = launch_command(SCRIPT, 2, str(tmp_path / "ck"), str(out), max_restarts=1)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "restart 1: resumed at step" in log, log  # it really was killed and restarted
    got = load_file(out)
    assert got.keys() == uninterrupted.keys()
    assert all(torch.equal(got[k], uninterrupted[k]) for k in got)
