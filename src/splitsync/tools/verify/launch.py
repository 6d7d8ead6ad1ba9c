"""Start the 1-process and N-process runs of verify side by side, with a hard timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Outcome", "torchrun", "script_command", "run_all"]


@dataclass(frozen=True)
class Outcome:
    """How one launch ended."""

    argv: tuple[str, ...]
    returncode: int | None  # None: killed at the timeout
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, lines: int = 10) -> str:
        """The end of the (last) Python traceback if there is one, else the last lines."""
        text = self.output.strip().splitlines()
        starts = [i for i, line in enumerate(text) if line.startswith("Traceback (most recent")]
        if not starts:
            return "\n".join(text[-lines:])
        block = text[starts[-1]:]
        end = next((i for i, line in enumerate(block[1:], 1)
                    if line and not line.startswith((" ", "\t"))), len(block) - 1)
        return "\n".join(block[: end + 1][-lines:])


def torchrun(nproc: int, target: Sequence[str]) -> list[str]:
    """torchrun on this machine (loopback rendezvous on a free port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), *target]


def script_command(world: int, target: Sequence[str]) -> list[str]:
    """``python target`` at one process, torchrun at more."""
    return [sys.executable, *target] if world == 1 else torchrun(world, target)


def run_all(commands: Sequence[tuple[Sequence[str], Mapping[str, str]]], timeout: float,
            on_exit: Callable[[int], None] | None = None) -> list[Outcome]:
    """Run the commands concurrently; kill what is still running after ``timeout`` seconds.

    ``on_exit(i)`` is called as soon as command ``i`` has ended (verify tells the other run).
    Output goes to temporary files, so a chatty command never blocks on a full pipe.
    """
    logs = [tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
            for _ in commands]
    procs = [subprocess.Popen(list(argv), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
             for (argv, env), log in zip(commands, logs, strict=True)]
    deadline = time.monotonic() + timeout
    codes: dict[int, int | None] = {}
    while len(codes) < len(procs):
        for i, p in enumerate(procs):
            if i not in codes and p.poll() is not None:
                codes[i] = p.returncode
                if on_exit is not None:
                    on_exit(i)
        if len(codes) < len(procs):
            if time.monotonic() > deadline:
                for i, p in enumerate(procs):
                    if i not in codes:
                        _kill(p)
                        codes[i] = None
                break
            time.sleep(0.05)
    outcomes = []
    for i, ((argv, _), log) in enumerate(zip(commands, logs, strict=True)):
        log.seek(0)
        out = log.read()
        log.close()
        if codes[i] is None:
            out += f"\n(killed after {timeout:g}s)"
        outcomes.append(Outcome(tuple(argv), codes[i], out))
    return outcomes


def _kill(p: subprocess.Popen[str]) -> None:
    """Kill the command and what it started (torchrun's workers share its session)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()
    p.wait()
