"""A full disk, for real: a 20 MB tmpfs mounted in a private mount namespace (``unshare``).
Under ddp and fsdp, blocking and in the background, every rank raises
``splitsync.CheckpointError`` (an Exception) saying the disk is full; the dead
``.tmp-step-*`` is gone, and the previous checkpoint resumes."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from splitsync.testing import clean_env

SCRIPT = Path(__file__).with_name("ckpt_full_disk_script.py")


@pytest.mark.slow
@pytest.mark.extended  # ddp and fsdp, blocking and background, in one long launch
@pytest.mark.timeout(420)
def test_full_disk_raises_checkpoint_error_on_every_rank(tmp_path: Path) -> None:
    assert shutil.which("unshare"), "util-linux's unshare is needed to mount a small tmpfs"
    mnt = tmp_path / "small"
    mnt.mkdir()
    inner = (f"mount -t tmpfs -o size=20m tmpfs {shlex.quote(str(mnt))} && exec "
             f"{shlex.quote(sys.executable)} {shlex.quote(str(SCRIPT))} {shlex.quote(str(mnt))}")
    # -r: root in a user namespace where the caller is not root; -m: the mount stays private
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", inner], env=clean_env(),
                          capture_output=True, text=True, timeout=400, cwd=SCRIPT.parent)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines[0]["fs_total"] <= 21 << 20  # really the small filesystem
    by = {x["strategy"]: x["ranks"] for x in lines[1:]}
    assert sorted(by) == ["ddp", "fsdp"]
    for strategy, ranks in by.items():
        for rank, res in enumerate(ranks):
            for mode in ("blocking", "background"):
                case = res[mode]
                where = f"{strategy} {mode} rank {rank}"
                assert case["error"] is not None, where
                kind, is_ckpt_error, msg = case["error"]
                assert kind == "CheckpointError" and is_ckpt_error, (where, msg)
                assert "the disk is full" in msg and "step 2" in msg, (where, msg)
                assert "MB to write" in msg, (where, msg)  # how much was needed
                assert not any(n.startswith(".tmp-step") for n in case["left"]), (where, case)
                assert "step-000001" in case["left"] and "step-000002" not in case["left"]
                assert case["resumed"] == 1 and case["same"], (where, case)
