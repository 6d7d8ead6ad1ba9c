"""The long-wait check's judgement and summary, the state files and the launcher's lines."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from splitsync.distributed.rankstate import (
    flight_recorder_env,
    innermost_user_line,
    main_thread_block,
    read_state,
    stacks_path,
    write_state,
)
from splitsync.launch.summary import MISMATCH_SENTENCE, library_dirs, rank_lines
from splitsync.observers.guards.waits import (
    DEFAULT_DESYNC_AFTER,
    desync_after_from,
    judge,
    summary,
)
from splitsync.run.config import GuardSettings


def _waiting(rank: int, call: int = 5, op: str = "all_reduce", shapes: str = "float32[]",
             site: str = "train.py:10", waited: float = 21.0) -> dict:
    return {"rank": rank, "state": "waiting", "call": call, "op": op, "shapes": shapes,
            "site": site, "waited": waited}


def test_same_call_everywhere_is_slow_not_out_of_step() -> None:
    states = {0: _waiting(0), 1: _waiting(1, waited=2.0)}
    assert judge(states, 2, 0) == []


def test_a_barrier_waits_for_a_rank_still_working() -> None:
    """run.main_process_first: rank 0 downloads while the others wait in a barrier."""
    running = {"rank": 0, "state": "running", "call": 4, "op": "", "site": "train.py:3"}
    states = {0: running, 1: _waiting(1, op="barrier", shapes="")}
    assert judge(states, 2, 1) == []
    states[1] = _waiting(1)
    assert "rank 0 has not reached any collective" in judge(states, 2, 1)[0]


def test_each_way_out_of_step_is_named() -> None:
    states = {0: _waiting(0), 1: _waiting(1, call=6, op="backward", site="train.py:8"),
              2: {"rank": 2, "state": "running", "call": 4, "op": "", "site": "train.py:30",
                  "stack": ["train.py:30 in main"]},
              3: _waiting(3, shapes="float32[3]"),
              4: {"rank": 4, "state": "closing", "call": 4, "op": "", "site": "train.py:40"}}
    reasons = judge(states, 6, 0)
    assert any("rank 1 is at call #6 backward" in r for r in reasons)
    assert any("rank 2 has not reached any collective" in r for r in reasons)
    assert any("rank 3 passes float32[3]" in r for r in reasons)
    assert any("rank 4 has left its loop" in r for r in reasons)
    assert any("rank 5 did not answer" in r for r in reasons)
    text = summary(states, 6, reasons, 21.0, 600)
    assert "not at the 600s timeout" in text
    assert "rank 2: running at train.py:30" in text
    assert "rank 4: left its loop after call #4: it is closing the run at train.py:40" in text
    assert "rank 5: no answer" in text
    assert "The ranks made different collective calls" in text


def test_a_dataloader_worker_is_named_with_its_stack() -> None:
    states = {0: _waiting(0), 1: {
        "rank": 1, "state": "running", "call": 4, "op": "", "site": "train.py:20",
        "worker": {"id": 2, "pid": 99, "site": "data.py:7",
                   "stack": ['File "data.py", line 7 in __getitem__']}}}
    text = summary(states, 2, judge(states, 2, 0), 21.0, 600)
    assert "rank 1 waits for its DataLoader worker 2 (pid 99)" in text
    assert "it is at data.py:7" in text and 'File "data.py", line 7' in text


def test_desync_after_setting() -> None:
    assert desync_after_from(None, {}) == DEFAULT_DESYNC_AFTER
    assert desync_after_from(None, {"SPLITSYNC_DESYNC_AFTER": "2.5"}) == 2.5
    assert desync_after_from(7, {"SPLITSYNC_DESYNC_AFTER": "2.5"}) == 7.0
    for bad in (0, -1, "soon"):
        with pytest.raises(ValueError, match="desync_after"):
            desync_after_from(None, {"SPLITSYNC_DESYNC_AFTER": str(bad)})
    with pytest.raises(ValueError, match="desync_after"):
        GuardSettings(desync_after=0)


DUMP = '''Fatal Python error: Aborted

Thread 0x00007f2b9d7fa6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait

Current thread 0x00007f2bc4e44b80 (most recent call first):
  File "{torch}/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{cwd}/train.py", line 81 in main
  File "{cwd}/train.py", line 87 in <module>
'''


def _dump(cwd: str) -> str:
    torch_dir = next(d for d in library_dirs() if d.rstrip(os.sep).endswith("torch"))
    return DUMP.format(torch=torch_dir.rstrip(os.sep), cwd=cwd)


def test_faulthandler_dump_main_thread_and_users_line(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    frames = main_thread_block(_dump(str(tmp_path)))
    assert len(frames) == 3 and "all_reduce" in frames[0]
    assert innermost_user_line(frames, library_dirs()) == "train.py:81"
    assert main_thread_block(_dump(str(tmp_path)), 0x00007F2B9D7FA6C0)[0].endswith("in wait")


def test_state_files_keep_the_first_account(tmp_path: Path) -> None:
    write_state(str(tmp_path), 1, {"state": "failed"})
    write_state(str(tmp_path), 1, {"state": "raised"}, keep=True)
    assert read_state(str(tmp_path), 1) == {"state": "failed"}
    write_state(None, 1, {"state": "x"})  # no folder (torchrun): nothing, no error
    assert read_state(str(tmp_path), 2) is None


def test_launcher_lines_for_each_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = str(tmp_path)
    Path(stacks_path(folder, 0)).write_text(_dump(folder))  # aborted inside all_reduce
    write_state(folder, 1, {"rank": 1, "state": "raised", "site": "train.py:40",
                            "error": "ValueError: boom"})
    Path(stacks_path(folder, 2)).write_text(  # stopped by the agent's SIGTERM
        f'Current thread 0x1 (most recent call first):\n  File "{folder}/train.py", '
        'line 50 in main\n')
    lines = rank_lines(folder, range(4), {0: -int(signal.SIGABRT), 1: 1})
    assert lines[0] == ("rank 0: died: killed by signal SIGABRT, at train.py:81 "
                        "(inside a collective)")
    assert lines[1] == "  rank 0's stack (most recent first):"
    assert "all_reduce" in lines[2] and "line 81 in main" in lines[3]
    rest = lines[5:]
    assert rest[0] == "rank 1: died: exited with code 1; raised ValueError: boom at train.py:40"
    assert rest[1] == "rank 2: running at train.py:50 when the launcher stopped it"
    assert rest[2] == "rank 3: stopped by the launcher (it left no state or stack)"
    assert rest[3] == MISMATCH_SENTENCE.format(who="rank 0")


def test_flight_recorder_only_under_splitsync_run_with_nccl(tmp_path: Path) -> None:
    env = {"SPLITSYNC_STATE_DIR": str(tmp_path)}
    assert flight_recorder_env({}, "nccl", None, 0) == {}
    assert flight_recorder_env(env, "gloo", None, 0) == {}
    got = flight_recorder_env(env, "nccl", str(tmp_path / "run"), 0)
    assert got["TORCH_FR_BUFFER_SIZE"] == "2000" and got["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert got["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "run" / "flight_recorder" / "rank_")
    mine = flight_recorder_env({**env, "TORCH_FR_BUFFER_SIZE": "10"}, "nccl", None, 0)
    assert "TORCH_FR_BUFFER_SIZE" not in mine  # the user's own setting stays


def _nap() -> None:
    import time

    time.sleep(1)


def test_only_a_forked_worker_is_asked_for_its_stack() -> None:
    """A worker started by "spawn" has no inherited dump: SIGUSR2 would kill it."""
    import multiprocessing

    from splitsync.observers.guards.stacks import forked

    child = multiprocessing.get_context("fork").Process(target=_nap)
    child.start()
    try:
        assert forked(child.pid)
        assert not forked(os.getpid())  # not a child of this process
    finally:
        child.join()


def test_an_inherited_stacks_file_is_not_this_process_own() -> None:
    from splitsync.observers.guards.stacks import own_stacks_file

    assert own_stacks_file(f"{os.getpid()}:/tmp/x.txt") == "/tmp/x.txt"
    assert own_stacks_file(f"{os.getpid() + 1}:/tmp/x.txt") is None  # the parent's
    assert own_stacks_file("") is None


def test_the_dump_file_leaves_nothing_on_disk_even_when_the_rank_is_killed(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import os, signal, time\n"
        "from splitsync.observers.guards.stacks import enable, DUMP_SIGNAL\n"
        "path = enable(0, None)\n"
        "os.kill(os.getpid(), DUMP_SIGNAL)\n"
        "time.sleep(0.2)\n"
        "print(open(path).read().count('File '))\n"
        "os._exit(0)\n"  # no atexit: as a rank stopped by the hang guard or killed
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("SPLITSYNC_STACKS_FILE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert int(out) >= 1  # the dump was written and read back
    assert list(tmp_path.iterdir()) == []


def test_a_worker_that_never_left_fork_is_explained() -> None:
    fork = ('File "/usr/lib/python3.11/multiprocessing/popen_fork.py", line 66 in _launch',
            'File "/usr/lib/python3.11/multiprocessing/popen_fork.py", line 19 in __init__')
    states = {0: {"rank": 0, "state": "running", "call": 0, "op": "", "site": "train.py:53",
                  "worker": {"id": 0, "pid": 1328, "site": "?", "stack": list(fork)}},
              1: _waiting(1)}
    text = summary(states, 2, judge(states, 2, 1), 21.0, 600)
    assert "never left fork()" in text and "python/cpython#112275" in text
    assert "multiprocessing_context='forkserver'" in text
    # a worker stuck in the user's dataset is not told this
    states[0]["worker"]["stack"] = ['File "data.py", line 7 in __getitem__', *fork]
    assert "never left fork()" not in summary(states, 2, judge(states, 2, 1), 21.0, 600)
