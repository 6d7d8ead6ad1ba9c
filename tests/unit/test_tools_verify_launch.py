"""verify's launcher: ranks from the fork server, whatever threads this process runs."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from splitsync.testing import clean_env
from splitsync.tools.verify.launch import Launch, run_all, start_method

# An object whose teardown a real process never reaches before exiting: ending the program
# must not run it (a DDP reducer's teardown can wait forever for its gloo worker thread).
TEARDOWN = """
import sys
class Noisy:
    def __del__(self):
        print("torn down", flush=True)
held = Noisy()
print("ran as", sys.argv[1:], flush=True)
if sys.argv[1:] == ["exit"]:
    raise SystemExit(3)
"""


def test_ranks_start_from_the_fork_server() -> None:
    # forking this process would copy its threads' locks (importing torch starts a thread)
    assert start_method() == "forkserver"


@pytest.mark.slow
def test_a_programs_objects_are_not_torn_down_before_it_exits(tmp_path: Path) -> None:
    script = tmp_path / "teardown.py"
    script.write_text(TEARDOWN)
    # (a launch whose rank fails has its other ranks killed: the failing one runs alone)
    outcomes = run_all([Launch(1, (str(script), "exit"), clean_env()),
                        Launch(2, (str(script), "run"), clean_env())], timeout=120)
    assert outcomes[0].returncode == 3 and outcomes[1].returncode == 0, outcomes
    assert outcomes[0].output.count("ran as ['exit']") == 1
    assert outcomes[1].output.count("ran as ['run']") == 2  # both ranks, one log
    assert "torn down" not in outcomes[0].output + outcomes[1].output


@pytest.mark.slow
def test_a_plain_ddp_script_ends_while_this_process_runs_threads() -> None:
    """The forked-rank hang: ranks forked from a process with threads, a DDP script's
    reducer torn down on return; either alone hung about one launch in three."""
    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, daemon=True)
    busy.start()
    plain = Path(__file__).parents[1] / "launcher" / "verify_scripts" / "plain_ddp.py"
    try:
        for _ in range(3):
            outcomes = run_all([Launch(2, (str(plain),), clean_env())], timeout=120)
            assert outcomes[0].returncode == 0, outcomes[0].output
    finally:
        stop.set()
