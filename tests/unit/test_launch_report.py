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


def _notes(*statuses: str) -> list[dict[str, object]]:
    return [{"rank": r, "status": s, "step": 6, "path": "ck/step-000006", "signal": "SIGTERM"}
            for r, s in enumerate(statuses)]


def test_how_a_stop_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from splitsync.launch.agent import report_stop
    from splitsync.launch.spec import LaunchSpec

    spec = LaunchSpec(script="train.py", nproc_per_node=2)
    term = SignalException("stop", signal.SIGTERM)
    crash = ChildFailedError("train.py", {1: _failure(1, 3)})
    # a saved stop is a preemption, whatever else happened on the way out
    assert report_stop(_notes("saved", "saved"), spec, None) == 75
    assert report_stop(_notes("saved", "saved"), spec, term) == 75
    assert "stopped after step 6 and saved it (ck/step-000006)" in capsys.readouterr().err
    assert report_stop(_notes("saved", "saved"), spec, crash) == 75
    # the grace period ran out: a preemption, unless a worker crashed (the others were
    # SIGTERMed by the agent and waited in vain)
    assert report_stop(_notes("deadline", "deadline"), spec, term) == 75
    assert "previous checkpoint: step 6" in capsys.readouterr().err
    assert report_stop(_notes("deadline"), spec, crash) == 3
    # every worker had finished its work before it could stop
    assert report_stop(_notes("finished", "finished"), spec, term) == 0
    assert "nothing was left to stop" in capsys.readouterr().err
    assert report_stop(_notes("finished"), spec, term) == 143  # one did not say so
    assert report_stop([], spec, None) == 0
    assert report_stop([], spec, term) == 143
