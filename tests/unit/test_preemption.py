"""The preemption board on a real TCPStore, the signal and grace settings, SLURM's job id,
and the notes a worker leaves for ``splitsync run``."""

from __future__ import annotations

import ast
import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from splitsync import RunConfig
from splitsync.preemption.board import LocalBoard, Request, make_board
from splitsync.preemption.defaults import parse_signals
from splitsync.preemption.exit import NOTES_VAR, read_notes, write_note
from splitsync.preemption.requeue import requeue, requeue_wanted, slurm_job_id
from splitsync.preemption.settings import PreemptionSettings
from splitsync.preemption.slurm import SlurmSource
from splitsync.preemption.sources import FileSource, SignalSource


@pytest.fixture()
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))


def test_signals_by_name_short_name_or_number() -> None:
    assert parse_signals(("SIGTERM", "usr1", int(signal.SIGUSR2), "SIGTERM")) == (
        signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    assert parse_signals("SIGINT") == (signal.SIGINT,)
    assert parse_signals(None) == () == parse_signals(())
    with pytest.raises(ValueError, match="SIGFOO.*preempt_signals=\\('SIGTERM'"):
        parse_signals(["SIGFOO"])
    with pytest.raises(ValueError, match="SIGKILL cannot be caught"):
        parse_signals(["SIGKILL"])
    with pytest.raises(ValueError, match="True is not a signal"):
        parse_signals([True])


def test_the_preemption_settings_are_checked_and_kept_parsed() -> None:
    assert RunConfig().preempt_signals == ("SIGTERM", "SIGUSR1")  # read through
    assert PreemptionSettings(preempt_signals=(10, "term")).preempt_signals == ("SIGUSR1", "SIGTERM")
    assert PreemptionSettings(preempt_signals=None).preempt_signals == ()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="preempt_grace=0"):
        PreemptionSettings(preempt_grace=0)
    with pytest.raises(ValueError, match="preempt_grace='x'"):
        PreemptionSettings(preempt_grace="x")  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(posts=st.lists(st.integers(0, 10_000), min_size=2, max_size=6))
def test_the_stop_step_is_one_past_the_largest_post_once_all_are_in(posts: list[int]) -> None:
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    world = len(posts)
    boards = [make_board(r, world, server) for r in range(world)]  # one run, every rank
    for rank, (board, steps) in enumerate(zip(boards, posts, strict=True)):
        assert board.stop_step() is None  # a post is missing
        board.post(rank, steps)
    assert {b.stop_step() for b in boards} == {max(posts) + 1}


def test_first_request_wins_and_every_rank_sees_it(store: dist.TCPStore) -> None:
    boards = [make_board(r, 3, store) for r in range(3)]
    assert all(b.requested() is None for b in boards)
    first = Request(2, "SIGUSR1", 123.5)
    assert boards[2].request(first) == first
    assert boards[0].request(Request(0, "SIGTERM", 124.0)) == first  # too late: the first
    assert {b.requested() for b in boards} == {first}


def test_each_run_on_a_store_meets_under_its_own_prefix(store: dist.TCPStore) -> None:
    one = [make_board(r, 2, store) for r in range(2)]
    two = [make_board(r, 2, store) for r in range(2)]  # a second run, same store, same ranks
    one[0].request(Request(0, "SIGTERM", 1.0))
    assert one[1].requested() is not None
    assert two[0].requested() is None and two[1].requested() is None
    for r in range(2):
        one[r].post(r, 7)
    assert two[0].stop_step() is None and one[1].stop_step() == 8


def test_one_process_needs_no_store() -> None:
    board = make_board(0, 1, None)
    assert isinstance(board, LocalBoard) and board.stop_step() is None
    req = Request(0, "SIGTERM", 1.0)
    assert board.request(req) == req and board.requested() == req
    board.post(0, 4)
    assert board.stop_step() == 5  # one boundary to take the stop's snapshot at


def test_slurm_job_ids_and_when_to_requeue() -> None:
    assert slurm_job_id({}) is None
    assert slurm_job_id({"SLURM_JOB_ID": "17"}) == "17"
    assert slurm_job_id({"SLURM_JOB_ID": "18", "SLURM_ARRAY_JOB_ID": "17",
                         "SLURM_ARRAY_TASK_ID": "1"}) == "17_1"
    assert requeue_wanted("SIGUSR1", {"SLURM_JOB_ID": "17"})
    assert not requeue_wanted("SIGTERM", {"SLURM_JOB_ID": "17"})  # scancel: stay cancelled
    assert not requeue_wanted("SIGUSR1", {})
    assert requeue({}) == "not a SLURM job"


def test_the_settings_pick_slurm_s_source_inside_a_slurm_job(tmp_path: Path) -> None:
    plain = PreemptionSettings()
    assert [type(s) for s in plain.sources({})] == [SignalSource]
    (slurm,) = plain.sources({"SLURM_JOB_ID": "17"})
    assert isinstance(slurm, SlurmSource) and slurm.job == "17"
    assert slurm.signals == ("SIGTERM", "SIGUSR1")
    with_file = PreemptionSettings(preempt_signals=(), preempt_file=str(tmp_path / "stop"))
    assert [type(s) for s in with_file.sources({"SLURM_JOB_ID": "17"})] == [SlurmSource,
                                                                            FileSource]
    assert [type(s) for s in with_file.sources({})] == [SignalSource, FileSource]


def test_slurm_s_source_fires_on_its_signal_and_requeues_after_a_stop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its signal is noted like any signal's; after the stop, rank 0 asks it to act: it
    runs ``scontrol requeue`` (a stand-in scontrol on PATH records the call) unless SLURM
    ended the job itself (SIGTERM)."""
    calls = tmp_path / "calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                        'if [ "$1" = show ]; then echo "JobId=17 Requeue=1"; fi\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    source = SlurmSource(("SIGUSR1",), {"SLURM_JOB_ID": "17"})
    woken: list[bool] = []
    source.start(lambda: woken.append(True))
    try:
        assert source.fired() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        fired = source.fired()
        assert fired is not None and fired[0] == "SIGUSR1" and woken
    finally:
        source.close()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler went back
    assert source.after_stop("SIGTERM") is None  # scancel, a time limit: stay cancelled
    assert not calls.exists()
    assert source.after_stop("SIGUSR1") == "SLURM job 17 requeued"
    assert calls.read_text().split("\n")[:2] == ["show job -o 17", "requeue 17"]
    # the others do nothing after a stop
    assert SignalSource(("SIGUSR1",)).after_stop("SIGUSR1") is None
    assert FileSource(tmp_path / "stop").after_stop(FileSource.NAME) is None


def test_notes_only_under_a_launcher_that_asked(tmp_path: Path) -> None:
    assert not write_note({}, 0, {"status": "saved"})
    assert not write_note({NOTES_VAR: str(tmp_path / "gone")}, 0, {"status": "saved"})
    env = {NOTES_VAR: str(tmp_path)}
    assert write_note(env, 1, {"status": "saved", "step": 6})
    assert write_note(env, 0, {"status": "saved", "step": 6})
    (tmp_path / "rank-00002.json").write_text("{torn")
    notes = read_notes(tmp_path)
    assert [(n["rank"], n["step"]) for n in notes] == [(0, 6), (1, 6)]


def test_the_launcher_passes_on_every_default_signal_and_dumps_on_another() -> None:
    from splitsync.launch.argv import AGENT_SIGNALS as used
    from splitsync.preemption.defaults import (
        AGENT_SIGNALS,
        DEFAULT_PREEMPT_SIGNALS,
        DUMP_SIGNAL_NAME,
    )

    assert used is AGENT_SIGNALS
    assert set(DEFAULT_PREEMPT_SIGNALS) <= set(AGENT_SIGNALS.split(","))
    assert {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"} <= set(AGENT_SIGNALS.split(","))
    assert DUMP_SIGNAL_NAME not in DEFAULT_PREEMPT_SIGNALS


def test_a_stop_file_fires_once_touched_and_not_for_an_old_one(tmp_path: Path) -> None:
    import os
    import time

    from splitsync.preemption.sources import FileSource

    path = tmp_path / "stop"
    path.touch()
    os.utime(path, (time.time() - 60, time.time() - 60))  # left by an earlier run
    source = FileSource(path)
    source.start(lambda: None)
    assert source.fired() is None
    path.unlink()
    assert source.fired() is None
    path.touch()
    fired = source.fired()
    assert fired is not None and fired[0] == FileSource.NAME
    assert Request.decode(Request(1, *fired).encode()) == Request(1, *fired)
    with pytest.raises(ValueError, match="preempt_file=3: give the path"):
        PreemptionSettings(preempt_file=3)  # type: ignore[arg-type]
    assert PreemptionSettings(preempt_file=path).preempt_file == str(path)  # type: ignore[arg-type]


def test_the_watcher_hands_a_source_s_request_to_the_board(tmp_path: Path) -> None:
    import threading

    from splitsync.preemption.sources import FileSource
    from splitsync.preemption.watch import Watcher

    seen: list[Request] = []
    got = threading.Event()
    board = LocalBoard()
    watcher = Watcher(rank=0, board=board, sources=[FileSource(tmp_path / "stop")],
                      grace=60.0, seen=lambda r: (seen.append(r), got.set()),
                      stopping=lambda: False, give_up=lambda: None)
    try:
        assert not got.wait(0.7)  # nothing asked yet
        (tmp_path / "stop").touch()
        assert got.wait(10)
        assert seen[0].signal == FileSource.NAME and board.requested() == seen[0]
    finally:
        watcher.close()


# Outside preemption/, the only modules that mention preemption, why each does, and the
# preemption modules each may import (nothing else of the package's room)
MENTIONS: dict[str, tuple[str, set[str]]] = {
    # the settings: init's keywords and RunConfig's read-through; the exception, exported
    "api.py": ("init's preempt_* keywords, built into PreemptionSettings",
               {"defaults", "settings"}),
    "run/config.py": ("RunConfig composes PreemptionSettings", {"settings"}),
    "errors.py": ("the Preempted exception a stop raises", set()),
    "__init__.py": ("exports Preempted and PREEMPTED_EXIT_CODE", {"exit"}),
    # the Run's arm and stop calls
    "run/preempt.py": ("the Run's side: hook the models, stop after the agreed step, save",
                       {"board", "exit", "sources", "watch"}),
    "run/runtime.py": ("arms at the first run.resume; closes it at run.close", set()),
    "run/checkpoints.py": ("run.resume arms it", set()),
    "run/tolerance.py": ("the part says whether run.resume arms it", set()),
    "ft/part.py": ("not armed under fault tolerance (a stopped group is a lost one)", set()),
    # the launcher's use of the shared defaults and exit protocol
    "launch/argv.py": ("the signals the agent passes on: AGENT_SIGNALS", {"defaults"}),
    "launch/spawn.py": ("the stack-dump signal no run stops on: DUMP_SIGNAL_NAME",
                        {"defaults"}),
    "observers/guards/stacks.py": ("the stack-dump signal no run stops on: DUMP_SIGNAL_NAME",
                                   {"defaults"}),
    "launch/spec.py": ("--shutdown-timeout's default: DEFAULT_SHUTDOWN_TIMEOUT",
                       {"defaults"}),
    "launch/agent.py": ("reads the workers' notes and exits with PREEMPTED_EXIT_CODE",
                        {"exit"}),
    "commands/run.py": ("its help says what a stop signal does, and the grace", set()),
    # a loader's workers outlive the signals the run stops on
    "data/build.py": ("wraps each loader's worker_init_fn with preemption/workers.py",
                      {"workers"}),
}


def _preemption_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {name.rsplit(".", 1)[-1] for name in names
            if name.startswith("splitsync.preemption.")}


def test_preemption_stays_in_its_room() -> None:
    """Outside preemption/, only the modules in MENTIONS mention it (the settings, the
    Run's arm and stop, the launcher's use of the shared defaults and exit protocol), each
    importing no more of preemption/ than listed. A new mention elsewhere belongs in
    preemption/ (or in MENTIONS, with why)."""
    import splitsync

    root = Path(splitsync.__file__).resolve().parent
    found = {str(p.relative_to(root)) for p in root.rglob("*.py")
             if "preempt" in p.read_text().lower() and p.parts[-2] != "preemption"}
    assert found == set(MENTIONS), found
    wider = {rel: imported - MENTIONS[rel][1] for rel in sorted(found)
             if (imported := _preemption_imports(root / rel)) - MENTIONS[rel][1]}
    assert not wider, wider
