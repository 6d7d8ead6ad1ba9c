"""Each of the lesson's examples runs, and says something true about its result.

The example 3 pair is launched for real (``splitsync run -n 2``, as the lesson says); the
other examples are about what the script computes, so the one-process ones run in this
interpreter and the two-process ones on ranks forked from the fork server.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launchkit import launch as launch_script
from launchkit import run_here, run_ranks

LESSON = Path(__file__).resolve().parents[2] / "examples" / "lesson"
pytestmark = pytest.mark.slow


def launch(name: str, nproc: int, *args: str, timeout: float = 120) -> str:
    """Run ``examples/lesson/<name>`` on ``nproc`` processes and return its output."""
    return launch_script(LESSON / name, nproc, *args, cwd=LESSON.parents[1], timeout=timeout)


def here(name: str) -> str:
    """``python examples/lesson/<name>``, run in this interpreter."""
    return run_here(LESSON / name, cwd=LESSON.parents[1])


def ranks(name: str) -> str:
    """``examples/lesson/<name>`` on two ranks from the fork server."""
    return run_ranks(LESSON / name, 2, cwd=LESSON.parents[1])


def _losses(out: str) -> tuple[float, float]:
    m = re.search(r"loss: first (\d+\.\d+) -> last (\d+\.\d+)", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


def test_exercise1_tensor_lands_on_the_detected_device() -> None:
    import torch

    out = here("exercise1_device.py")
    expected = "cuda:0" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu")
    assert re.search(rf"tensor device: {expected}(:0)?\b", out), out
    assert "tensor shape: (3, 4)" in out


def test_exercise1_splitsync_every_rank_reports_its_tensor() -> None:
    out = ranks("exercise1_device_splitsync.py")
    assert sorted(re.findall(r"rank (\d): tensor shape: \(3, 4\)", out)) == ["0", "1"]


def test_example1_single_device_lowers_the_loss_and_two_processes_match_it() -> None:
    plain = _losses(here("example1_single_device.py"))
    assert plain[1] < plain[0] / 2
    # Same seed, full batch split in two, gradients averaged: the same losses as one device.
    out = ranks("example1_single_device_splitsync.py")
    assert "processes: 2" in out
    assert _losses(out) == pytest.approx(plain, abs=2e-4)


def test_exercise2_output_shape_stays_8_by_2() -> None:
    out = here("exercise2_data_parallel.py")
    assert "output shape: (8, 2)" in out
    import torch

    if torch.cuda.device_count() < 2:
        assert "fewer than 2 GPUs" in out
        assert "merged (8, 2); same as one pass: True" in out
    assert "one training step done" in out


def test_exercise2_splitsync_slices_gather_back_to_8_by_2() -> None:
    out = ranks("exercise2_data_parallel_splitsync.py")
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
    # `python script` outside a launcher: SystemExit with a message that names torchrun
    with pytest.raises(AssertionError, match="exited 'Launch with: torchrun --standalone"):
        here("example3_ddp_torchrun.py")
