"""A run never closed closes itself at interpreter exit, on every rank, under any launcher.

``run = ss.init()`` without ``with`` and without ``run.close()`` used to end with exit code
134 (``terminate called without an active exception``) in about half of the launches at 2
ranks when a background save was still in flight: its thread, its gloo group and the
process group were torn down by the interpreter's exit in any order. ``init`` now registers
``run.close()`` with ``atexit`` (``run.close()`` takes it back). ``benchmarks/unclosed_exit.py``
launches it 20 times and more; here a few launches, with one core kept busy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from launchkit import launch_command

from splitsync.testing import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SCRIPT = Path(__file__).parent / "scripts" / "unclosed_run.py"


@pytest.fixture
def busy_core() -> Iterator[None]:
    """One core kept busy by a loop: exit-time races show more often on a loaded machine."""
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        loop.kill()
        loop.wait()


def _launch(command: list[str]) -> subprocess.CompletedProcess[str]:
    # no second attempt on gloo's abort at exit (launchkit's): that abort is what is tested
    proc = subprocess.Popen(command, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker it started
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(command)} hung:\n{out}\n{err}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.mark.usefixtures("busy_core")
@pytest.mark.parametrize("launches", [2, pytest.param(5, marks=pytest.mark.extended)])
def test_an_unclosed_run_exits_zero_under_splitsync_run_and_torchrun(tmp_path: Path,
                                                                      launches: int) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    for i in range(launches):  # the last under torchrun, the others under splitsync run
        cmd = (launch_command(SCRIPT, 2, str(tmp_path / f"ck{i}")) if i < launches - 1
               else [*torchrun, str(SCRIPT), str(tmp_path / f"ck{i}")])
        proc = _launch(cmd)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"launch {i}: exit {proc.returncode}\n{log}"
        assert "done" in proc.stdout and "terminate called" not in log
        assert (tmp_path / f"ck{i}" / "step-000016").is_dir()  # the save in flight committed


def test_a_rank_that_crashes_at_the_end_does_not_hang_its_peers(tmp_path: Path) -> None:
    """Rank 1 raises: it closes without the exit barrier, the launcher reports its failure
    and rank 0 is not left waiting (the test's timeout would say so)."""
    proc = _launch(launch_command(SCRIPT, 2, str(tmp_path / "ck"), "--crash-rank", "1"))
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "this rank crashes at the end" in log, log
    assert "terminate called" not in log
