"""splitsync.testing.spawn: each rank gets ``env`` before anything of the caller's is imported."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import splitsync
from splitsync.testing import SpawnError, spawn

pytestmark = pytest.mark.timeout(120)

MODULE = '''
import os
AT_IMPORT = os.environ.get("SPLITSYNC_TEST_MARK")  # read once, as fsspec reads its config

def report(rank, world):
    return AT_IMPORT, os.environ.get("SPLITSYNC_TEST_MARK")
'''


def test_fn_module_is_imported_with_the_ranks_environment(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "envmark_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SPLITSYNC_TEST_MARK", raising=False)
    import envmark_mod

    # the fork server may already run, started without the variable: it must not matter
    assert spawn(envmark_mod.report, 1) == [(None, None)]
    got = spawn(envmark_mod.report, 2, env={**dict(__import__("os").environ),
                                            "SPLITSYNC_TEST_MARK": "yes"})
    assert got == [("yes", "yes"), ("yes", "yes")]
    sys.modules.pop("envmark_mod", None)



class _Stuck(Dataset):
    """A dataset whose worker never returns: stands for a deadlocked DataLoader worker."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        Path(self.mark).write_text(str(os.getpid()))
        time.sleep(600)
        return i


def _stuck_in_a_named_place(rank: int, world: int, mark: str) -> None:
    with splitsync.init(seed=0, guards=False):
        if rank == 0:  # a collective that never completes: rank 1 never sends
            dist.recv(torch.zeros(1), src=1)
        # rank 1 waits on a worker that waits forever: both stacks must be shown
        for _ in DataLoader(_Stuck(mark), num_workers=1, multiprocessing_context="fork"):
            pass


def _gone(pid: int, within: float = 10.0) -> bool:
    """Has ``pid`` exited (a kill takes effect a moment after it is sent)?"""
    until = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() > until:
            return False
        time.sleep(0.05)


def test_spawn_timeout_shows_the_hung_ranks_stacks_and_kills_their_workers(
        tmp_path: Path) -> None:
    """Instead of hanging, spawn times out, names each hung rank and shows where it waits:
    rank 0 in a collective, rank 1 in the DataLoader's wait on its worker."""
    mark = tmp_path / "worker.pid"
    with pytest.raises(SpawnError) as err:
        spawn(_stuck_in_a_named_place, 2, str(mark), timeout=8)  # ranks start in ~0.1 s
    text = str(err.value)
    assert "rank(s) [0, 1] did not finish" in text
    assert "stacks of rank 0" in text and "stacks of rank 1" in text
    rank0 = text.split("stacks of rank 0")[1].split("stacks of rank 1")[0]
    assert "_stuck_in_a_named_place" in rank0 and "recv" in rank0
    assert "_stuck_in_a_named_place" in text  # the rank's frame, in the DataLoader's wait
    assert "__getitem__" in text  # the frame of the worker it forked
    if sys.platform.startswith("linux"):
        assert _gone(int(mark.read_text())), "the rank's DataLoader worker outlived it"
