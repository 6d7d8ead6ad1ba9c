"""Debug mode: a rank with one extra all_reduce is named, with the call number and each line."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import splitsync
from splitsync.observers.guards.desync import DesyncError
from splitsync.testing import spawn

pytestmark = pytest.mark.timeout(120)

HERE = os.path.relpath(__file__)


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(marker))


EXTRA_LINE = _line("# extra call")
NEXT_LINE = _line("# call made by every rank")


def _extra_all_reduce(rank: int, world: int) -> tuple[str, bool]:
    original = dist.all_reduce
    run = splitsync.init(seed=0, debug=True, timeout=20)
    error = "no error"
    try:
        run.mean(torch.ones(4))
        if rank == 1:
            dist.all_reduce(torch.ones(4))  # extra call
        run.mean(torch.ones(4))  # call made by every rank
    except DesyncError as exc:
        error = str(exc)
    finally:
        run.close(clean=False)
    return error, dist.all_reduce is original


def test_extra_all_reduce_names_rank_call_and_lines() -> None:
    for msg, restored in spawn(_extra_all_reduce, 2):
        assert restored, "debug mode must restore torch.distributed at close"
        assert "out of sync at collective call #2" in msg
        assert "rank(s) [1] diverged" in msg
        assert f"rank 0: #2 all_reduce(float32[4]) at {HERE}:{NEXT_LINE}" in msg
        assert f"rank 1: #2 all_reduce(float32[4]) at {HERE}:{EXTRA_LINE}   <- diverged" in msg


def _extra_call_at_the_end(rank: int, world: int) -> str:
    try:
        with splitsync.init(seed=0, timeout=20) as run:  # debug switched on by the environment
            run.mean(torch.ones(2))
            if rank == 1:
                run.sum(torch.ones(2))
    except DesyncError as exc:
        return str(exc)
    return "no error"


def test_environment_switch_and_a_trailing_extra_call() -> None:
    for msg in spawn(_extra_call_at_the_end, 2, env={**os.environ, "SPLITSYNC_DEBUG": "1"}):
        assert "rank(s) [1] diverged" in msg
        assert "close() at" in msg and "all_reduce(float32[2]) at" in msg


def _no_debug(rank: int, world: int) -> bool:
    original = dist.all_reduce
    with splitsync.init(seed=0) as run:
        patched = dist.all_reduce is not original
        run.mean(1.0)
    return patched


def test_debug_off_patches_nothing() -> None:
    assert spawn(_no_debug, 2) == [False, False]
