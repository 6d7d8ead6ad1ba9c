"""Launch ``scripts/hang_kinds.py`` with one mistake, time it, and find each rank's line.

Shared by tests/launcher/test_hang_kinds.py and benchmarks/hang_times.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "scripts" / "hang_kinds.py"
SRC = HERE.parent.parent / "src"
KINDS = ("skip", "add", "break", "spin", "loader", "raise", "shapes")
_DIVERGED = re.compile(r"^DIVERGED (\d+\.\d+)", re.MULTILINE)


def marker_line(marker: str) -> int:
    """The line of ``scripts/hang_kinds.py`` that carries ``# MARKER``."""
    for number, text in enumerate(SCRIPT.read_text().splitlines(), start=1):
        if f"# {marker}" in text:
            return number
    raise AssertionError(f"no line marked {marker} in {SCRIPT}")


def site(marker: str) -> str:
    return f"hang_kinds.py:{marker_line(marker)}"


@dataclass(frozen=True)
class Ended:
    """How one launch ended."""

    returncode: int
    output: str  # stdout and stderr together
    after_divergence: float  # seconds from the first DIVERGED line to the launcher's exit


def command(kind: str, nproc: int, launcher: str, *extra: str) -> list[str]:
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(nproc), str(SCRIPT), kind, *extra]
    return [sys.executable, "-m", "splitsync", "run", "-n", str(nproc), str(SCRIPT), kind,
            *extra]


def launch_kind(kind: str, nproc: int, launcher: str, *extra: str,
                desync_after: float | None = 3.0, timeout: float = 150.0) -> Ended:
    """Run one kind to its end (killed, with everything it started, after ``timeout``)."""
    from splitsync.testing import clean_env

    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["CUDA_VISIBLE_DEVICES"] = ""
    if desync_after is not None:
        env["SPLITSYNC_DESYNC_AFTER"] = str(desync_after)
    proc = subprocess.Popen(command(kind, nproc, launcher, *extra), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=str(HERE))
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n(killed after {timeout}s)"
    ended = time.time()
    try:  # a worker's orphan (a hung DataLoader worker) must not outlive the test
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    starts = [float(t) for t in _DIVERGED.findall(out)]
    after = ended - min(starts) if starts else float("nan")
    return Ended(proc.returncode, out, after)


def rank_says(output: str, rank: int, state: str, where: str) -> bool:
    """Whether some line names ``rank`` with ``state`` (a regex) and the line ``where``."""
    pattern = re.compile(rf"rank {rank}: .*(?:{state}).*{re.escape(where)}")
    return any(pattern.search(line) for line in output.splitlines())
