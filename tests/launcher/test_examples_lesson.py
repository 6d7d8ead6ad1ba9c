"""Each of the lesson's examples runs, and says something true about its result."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from launchkit import launch as launch_script

from splitsync.testing import clean_env

LESSON = Path(__file__).resolve().parents[2] / "examples" / "lesson"
pytestmark = pytest.mark.slow


def launch(name: str, nproc: int, *args: str, timeout: float = 120) -> str:
    """Run ``examples/lesson/<name>`` on ``nproc`` processes and return its output."""
    return launch_script(LESSON / name, nproc, *args, cwd=LESSON.parents[1], timeout=timeout)


def _losses(out: str) -> tuple[float, float]:
    m = re.search(r"loss: first (\d+\.\d+) -> last (\d+\.\d+)", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


def test_exercise1_tensor_lands_on_the_detected_device() -> None:
    import torch

    out = launch("exercise1_device.py", 1)
    expected = "cuda:0" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert re.search(rf"tensor device: {expected}(:0)?\b", out), out
    assert "tensor shape: (3, 4)" in out


def test_exercise1_splitsync_every_rank_reports_its_tensor() -> None:
    out = launch("exercise1_device_splitsync.py", 2)
    assert sorted(re.findall(r"rank (\d): tensor shape: \(3, 4\)", out)) == ["0", "1"]


def test_example1_single_device_training_lowers_the_loss() -> None:
    first, last = _losses(launch("example1_single_device.py", 1))
    assert last < first / 2


def test_example1_splitsync_two_processes_match_one_device() -> None:
    # Same seed, full batch split in two, gradients averaged: the same losses as one device.
    plain = _losses(launch("example1_single_device.py", 1))
    out = launch("example1_single_device_splitsync.py", 2)
    assert "processes: 2" in out
    assert _losses(out) == pytest.approx(plain, abs=2e-4)


def test_exercise2_output_shape_stays_8_by_2() -> None:
    out = launch("exercise2_data_parallel.py", 1)
    assert "output shape: (8, 2)" in out
    import torch

    if torch.cuda.device_count() < 2:
        assert "fewer than 2 GPUs" in out
        assert "merged (8, 2); same as one pass: True" in out
    assert "one training step done" in out


def test_exercise2_splitsync_slices_gather_back_to_8_by_2() -> None:
    out = launch("exercise2_data_parallel_splitsync.py", 2)
    assert sorted(re.findall(r"rank (\d): input \(4, 10\) -> output \(4, 2\)", out)) \
        == ["0", "1"]
    assert "gathered output shape: (8, 2); same as one pass: True" in out


def _check_ddp(out: str) -> None:
    assert "epoch 0 shard sizes: [128, 128], union covers 256/256, overlap 0" in out
    assert sorted(re.findall(r"rank (\d): weights identical to rank 0: True", out)) == ["0", "1"]


def test_example3_torchrun_trains_on_disjoint_shards_and_stays_in_sync() -> None:
    out = launch("example3_ddp_torchrun.py", 2)
    _check_ddp(out)
    assert re.search(r"rank 1, epoch 4, loss", out)  # train() really ran


def test_example3_splitsync_same_guarantees() -> None:
    out = launch("example3_ddp_splitsync.py", 2)
    _check_ddp(out)
    assert len(re.findall(r"epoch \d \| loss", out)) == 5  # logged once per epoch


def test_example3_torchrun_refuses_to_run_without_a_launcher() -> None:
    proc = subprocess.run([sys.executable, str(LESSON / "example3_ddp_torchrun.py")],
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "torchrun" in proc.stderr
