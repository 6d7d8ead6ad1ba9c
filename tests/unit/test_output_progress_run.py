"""Run.progress decides by rank: rank 0 reports, any other rank gets its iterable back."""

from __future__ import annotations

import contextlib
import io

import torch

from splitsync.distributed.env import DistEnv
from splitsync.run.config import RunConfig
from splitsync.run.runtime import Run
from splitsync.train.precision import get_precision


def _run(rank: int, world_size: int) -> Run:
    env = DistEnv(launcher="env", rank=rank, local_rank=rank, world_size=world_size,
                  local_world_size=world_size)
    return Run(RunConfig(seed=0), env, torch.device("cpu"), "gloo", 0, owns_group=False,
               handler=None, precision=get_precision("32", torch.device("cpu")),
               strategy="ddp" if world_size > 1 else "single")


def test_rank_one_is_silent_and_pays_nothing() -> None:
    run = _run(1, 2)
    data = list(range(5))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        wrapped = run.progress(data, desc="train", every=1)
        assert wrapped is data  # no wrapper at all on other ranks
        assert list(wrapped) == data
    assert buf.getvalue() == ""


def test_rank_zero_off_a_terminal_prints_plain_lines() -> None:
    run = _run(0, 2)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert list(run.progress(range(6), desc="train", every=3)) == list(range(6))
    lines = buf.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["3/6", "6/6"]
    assert all(line.startswith("train: ") for line in lines)
