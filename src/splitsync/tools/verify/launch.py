"""Start verify's launches side by side, with a hard timeout.

A launch is a Python program (a script, or ``-m module``) at one or more processes on this
machine (loopback, a free port; ``init()`` reads the plain ``RANK``/``WORLD_SIZE``
variables). Ranks are forked from multiprocessing's fork server, a fresh single-threaded
process that imports torch once: a fresh interpreter per rank spends seconds importing it,
and forking this process is unsafe once it has threads (a lock another thread holds at the
fork, in an fsspec event loop or an OpenMP pool, stays held forever in the child; importing
torch alone starts one). Each rank runs the program as ``__main__`` (``runpy``) with the
launch's environment, its own session (so a timeout kills what it started) and its output in
a log. Where there is no fork server (no ``fork``), each rank is a fresh interpreter.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import IO, Union

from splitsync.distributed.ports import free_port
from splitsync.launch.spawn import FORKSERVER_PRELOAD

__all__ = ["Outcome", "Launch", "run_all", "start_method"]

# A rank: a process from the fork server, or a fresh interpreter.
Rank = Union[BaseProcess, "subprocess.Popen[str]"]


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


@dataclass(frozen=True)
class Launch:
    """``target`` (``["script.py", args...]`` or ``["-m", "module", args...]``) at ``world``
    processes with environment ``env``."""

    world: int
    target: tuple[str, ...]
    env: Mapping[str, str]


def start_method() -> str:
    """How ranks start here: "forkserver", or "spawn" (a fresh interpreter per rank)."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _served(target: Sequence[str], env: Mapping[str, str], log_path: str) -> None:
    """A rank started by the fork server: append to the launch's log, then run the program."""
    # the platform's default start method, as under torchrun (DataLoader workers fork)
    mp.set_start_method(None, force=True)
    with open(log_path, "a", encoding="utf-8", errors="replace") as log:
        _run_here(target, env, log)


def _rank_env(launch: Launch, rank: int, port: int) -> dict[str, str]:
    env = dict(launch.env)
    if launch.world > 1:
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(launch.world),
                   LOCAL_WORLD_SIZE=str(launch.world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
    return env


def _run_here(target: Sequence[str], env: Mapping[str, str], log: IO[str]) -> None:
    """In a rank from the fork server: become the program and never return (exit with its code)."""
    code = 1
    # What the program leaves behind (its globals, the exception that ended it) stays alive
    # until os._exit: tearing it down here, as runpy would when its copy of the globals is
    # dropped, runs destructors a real process never runs at exit, and one of them (a DDP
    # reducer releasing its gloo group) can wait forever for its worker thread.
    kept: list[object] = []
    try:
        os.setsid()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace",  # noqa: SIM115
                          closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace",  # noqa: SIM115
                          closefd=False)
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            kept.append(runpy.run_module(target[1], run_name="__main__", alter_sys=True))
        else:
            sys.argv = list(target)
            sys.path[0] = os.path.dirname(os.path.abspath(target[0]))
            kept.append(runpy.run_path(target[0], run_name="__main__"))
        code = 0
    except SystemExit as exc:
        kept.append(exc)
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        kept.append(exc)
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _start(launch: Launch, log: IO[str], how: str) -> list[Rank]:
    port = free_port() if launch.world > 1 else 0
    ranks: list[Rank] = []
    for rank in range(launch.world):
        env = _rank_env(launch, rank, port)
        if how == "forkserver":
            ctx = mp.get_context("forkserver")
            # the preload takes effect if this call starts the server (later calls reuse it)
            ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
            # not a daemon: a daemon may not start processes (DataLoader workers, say)
            proc = ctx.Process(target=_served, args=(launch.target, env, log.name))
            proc.start()
            ranks.append(proc)
        else:
            ranks.append(subprocess.Popen([sys.executable, *launch.target], env=env,
                                          stdout=log, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
    return ranks


def _poll(rank: Rank) -> int | None:
    if isinstance(rank, subprocess.Popen):
        return rank.poll()
    return rank.exitcode


def _kill(rank: Rank) -> None:
    """Kill the rank and what it started (each rank leads its own session)."""
    assert rank.pid is not None  # started
    try:
        os.killpg(rank.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if isinstance(rank, subprocess.Popen):
        rank.wait()
    else:
        rank.kill()  # in case it died before leading its own session
        rank.join()


def run_all(launches: Sequence[Launch], timeout: float,
            on_exit: Callable[[int], None] | None = None) -> list[Outcome]:
    """Run the launches concurrently; kill what is still running after ``timeout`` seconds.

    A launch ends when all its ranks have, or when one fails (the others are killed then:
    a rank waiting for it in a collective would wait for the timeout). ``on_exit(i)`` is
    called as soon as launch ``i`` has ended. Output goes to temporary files, never pipes.
    """
    how = start_method()
    # named: ranks from the fork server open their launch's log by its path
    logs = [tempfile.NamedTemporaryFile(mode="w+", encoding="utf-8", errors="replace",
                                        prefix="splitsync-verify-", suffix=".log")
            for _ in launches]
    ranks = [_start(launch, log, how) for launch, log in zip(launches, logs, strict=True)]
    codes: list[list[int | None]] = [[None] * len(r) for r in ranks]
    done: dict[int, int | None] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(launches):
        for i, group in enumerate(ranks):
            if i in done:
                continue
            for j, rank in enumerate(group):
                if codes[i][j] is None:
                    codes[i][j] = _poll(rank)
            failed = next((c for c in codes[i] if c not in (None, 0)), None)
            if failed is not None or all(c is not None for c in codes[i]):
                for j, rank in enumerate(group):
                    if codes[i][j] is None:
                        _kill(rank)
                done[i] = failed if failed is not None else 0
                if on_exit is not None:
                    on_exit(i)
        if len(done) < len(launches):
            if time.monotonic() > deadline:
                for i, group in enumerate(ranks):
                    if i not in done:
                        for j, rank in enumerate(group):
                            if codes[i][j] is None:
                                _kill(rank)
                        done[i] = None
                break
            time.sleep(0.05)
    outcomes = []
    for i, (launch, log) in enumerate(zip(launches, logs, strict=True)):
        log.seek(0)
        out = log.read()
        log.close()
        if done[i] is None:
            out += f"\n(killed after {timeout:g}s)"
        argv = (f"{launch.world} process(es):", *launch.target)
        outcomes.append(Outcome(argv, done[i], out))
    return outcomes
