"""Start the 1-process and N-process runs of verify side by side, with a hard timeout."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Outcome", "torchrun", "run_all"]


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


def run_all(commands: Sequence[tuple[Sequence[str], Mapping[str, str]]],
            timeout: float) -> list[Outcome]:
    """Run the commands concurrently; kill what is still running after ``timeout`` seconds."""
    procs = [subprocess.Popen(list(argv), env=dict(env), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for argv, env in commands]
    deadline = time.monotonic() + timeout
    outcomes = []
    for p, (argv, _) in zip(procs, commands, strict=True):
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            outcomes.append(Outcome(tuple(argv), p.returncode, out))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            outcomes.append(Outcome(tuple(argv), None, out + f"\n(killed after {timeout:g}s)"))
    return outcomes
