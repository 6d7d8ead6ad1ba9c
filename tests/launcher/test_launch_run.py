"""`splitsync run` end to end: every rank runs, failures propagate, arguments arrive untouched."""

from __future__ import annotations

import json
import shlex
import socket
import sys
from pathlib import Path

import pytest
from launch_helpers import SCRIPTS, env, ranks_in, splitsync
from launchkit import launch_anew

pytestmark = pytest.mark.slow
RANKS = str(SCRIPTS / "launch_ranks.py")
LISTENERS = str(SCRIPTS / "launch_listeners.py")


def test_two_processes_all_ranks_run_args_untouched_loopback_only(tmp_path: Path) -> None:
    # One launch for two checks: what reaches every rank, and where the run listens.
    args = ["-n", "5", "--dry-run", "--nnodes", "3:2", "a b"]
    r = splitsync("run", "-n", "2", LISTENERS, str(tmp_path), *args)
    assert r.returncode == 0, r.stderr
    assert {int(p.stem.split("_")[1]) for p in tmp_path.glob("listen_*.json")} == {0, 1}
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"listen_{rank}.json").read_text())
        assert seen["args"] == args
        assert seen["world_size"] == "2"
        assert seen["master_addr"] == "127.0.0.1"
        assert seen["omp"] == "1"  # 2 cores here or more: never more threads than cores
        if not sys.platform.startswith("linux"):
            continue  # the listening sockets are read from /proc/net/tcp
        assert seen["agent"], "the agent hosts the rendezvous store, so it must listen"
        for address in seen["agent"] + seen["worker"]:
            host = address.rsplit(":", 1)[0]
            assert host in ("127.0.0.1", "::1"), f"listening on {address}: {seen}"
    assert r.stderr.count("OMP_NUM_THREADS=") == 1  # said once, by splitsync


def test_one_process(tmp_path: Path) -> None:
    r = splitsync("run", "-n", "1", RANKS, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert ranks_in(tmp_path) == {0}


def test_failing_rank_is_named_and_exit_code_propagates(tmp_path: Path) -> None:
    r = splitsync("run", "-n", "2", RANKS, str(tmp_path), LAUNCH_TEST_FAIL_RANK="1")
    assert r.returncode == 3, r.stderr
    assert "rank 1 (local rank 1" in r.stderr and "exited with code 3" in r.stderr
    assert "Traceback" not in r.stderr and "ChildFailedError" not in r.stderr


def test_python_dash_m_splitsync_dry_run_is_a_working_torchrun_command(tmp_path: Path) -> None:
    r = splitsync("run", "--dry-run", "-n", "2", RANKS, str(tmp_path), "--x", "1")
    assert r.returncode == 0, r.stderr
    assert not ranks_in(tmp_path)  # nothing ran
    words = shlex.split(r.stdout.strip())
    assignments = [w for w in words[: words.index("torchrun")] if "=" in w]
    argv = words[words.index("torchrun") + 1:]
    run_env = env(**dict(a.split("=", 1) for a in assignments))
    done, _ = launch_anew(lambda _: [sys.executable, "-m", "torch.distributed.run", *argv],
                          tmp_path / "launches", env=run_env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ranks_in(tmp_path) == {0, 1}
    assert json.loads((tmp_path / "rank_1").read_text())["args"] == ["--x", "1"]


@pytest.mark.parametrize("argv, message", [
    (["run", "-n", "2", "no_such_script.py"], "script 'no_such_script.py' not found"),
    (["run", "-n", "0", RANKS], "at least one process per node"),
    (["run", "--nnodes", "3:2", RANKS], "--nnodes 3:2"),
    (["run", "--nnodes", "2", RANKS], "needs --rdzv-endpoint"),
], ids=["missing-script", "n0", "nnodes-3:2", "no-endpoint"])
def test_bad_input_is_one_clear_line(argv: list[str], message: str) -> None:
    r = splitsync(*argv, timeout=60)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_port_in_use_is_reported_before_launch(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = splitsync("run", "-n", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", RANKS,
                      str(tmp_path), timeout=60)
    assert r.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr
    assert "Traceback" not in r.stderr
    assert not ranks_in(tmp_path)


def test_missing_script_argument_is_a_usage_error() -> None:
    r = splitsync("run", "-n", "2", timeout=60)
    assert r.returncode == 2
    assert "SCRIPT" in r.stderr and "Traceback" not in r.stderr


def test_help_has_examples() -> None:
    r = splitsync("run", "--help", timeout=60)
    assert r.returncode == 0
    assert "examples:" in r.stdout and "--rdzv-endpoint" in r.stdout
