"""How `splitsync run` reports worker failures: the ranks, the exit code, no traceback."""

from __future__ import annotations

import time

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from splitsync.launch.agent import report_children


def _failure(local_rank: int, exitcode: int) -> ProcessFailure:
    f = ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode,
                       error_file="<N/A>")
    f.timestamp = int(time.time()) + local_rank
    return f


def test_first_failure_gives_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    code = report_children({3: _failure(1, 7), 2: _failure(0, 1)})
    err = capsys.readouterr().err
    assert code == 1  # rank 2 failed first (earlier timestamp)
    assert "rank 3 (local rank 1, pid 1001) exited with code 7" in err
    assert "rank(s) 2, 3; first failure: rank 2" in err


def test_a_signal_is_reported_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert report_children({0: _failure(0, -9)}) == 137
    assert "killed by signal SIGKILL" in capsys.readouterr().err
