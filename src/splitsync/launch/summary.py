"""One line per rank after a failed job: what it was doing and its line in the user's code.

The workers leave their state and their stacks in the folder ``splitsync run`` gave them
(:mod:`splitsync.distributed.rankstate`): a rank that found the job out of step says where
each rank was, a rank that raised says what and where, a rank that crashed left its
``faulthandler`` dump, and a rank the agent stopped with SIGTERM dumped its stacks first.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import sysconfig
from typing import Any

from splitsync.distributed.rankstate import (
    flight_recorder_folder,
    innermost_user_line,
    main_thread_block,
    read_state,
    stacks_path,
)

__all__ = ["rank_lines", "library_dirs", "flight_records", "MISMATCH_SENTENCE"]

MISMATCH_SENTENCE = ("The ranks made different collective calls: {who} aborted inside a "
                     "collective, which gloo does when the data a peer sends does not match "
                     "what this rank's own call expects (another op, size or dtype; "
                     "gloo::EnforceNotMet, \"Received data size doesn't match expected "
                     "size\"). Look above for each rank's line: they must make the same "
                     "calls with the same shapes.")


def library_dirs() -> tuple[str, ...]:
    """torch's, splitsync's and the standard library's folders (torch is not imported)."""
    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
            sysconfig.get_paths()["stdlib"] + os.sep]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        dirs.append(os.path.dirname(os.path.abspath(spec.origin)) + os.sep)
    return tuple(dirs)


def _stack_text(folder: str, rank: int) -> str:
    try:
        with open(stacks_path(folder, rank)) as f:
            return f.read()
    except OSError:
        return ""


def _how(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _state_words(state: dict[str, Any]) -> str:
    kind = state.get("state")
    if kind == "waiting":
        return (f"waiting in call #{state.get('call')} {state.get('op')} at "
                f"{state.get('site')} for {float(state.get('waited', 0)):.1f}s")
    if kind == "running":
        worker = state.get("worker")
        extra = (f", waiting for its DataLoader worker {worker['id']} (pid {worker['pid']}), "
                 f"which is at {worker.get('site', '?')}" if worker else "")
        return f"running at {state.get('site')}, outside any collective{extra}"
    if kind == "failed":
        return (f"waiting in call #{state.get('call')} {state.get('op')} at "
                f"{state.get('site')} when it failed ({state.get('error', '')[:120]})")
    if kind == "raised":
        return f"raised {state.get('error')} at {state.get('site')}"
    return str(kind)


def rank_lines(folder: str, ranks: range, failures: dict[int, int]) -> list[str]:
    """One line per rank of this node (``failures``: rank -> exit code of those the agent
    saw fail), and the sentence on mismatched calls when a rank aborted inside one."""
    libs = library_dirs()
    lines, aborted = [], []
    for rank in ranks:
        state = read_state(folder, rank)
        frames = main_thread_block(_stack_text(folder, rank),
                                   state.get("main_thread") if state else None)
        line = innermost_user_line(frames, libs)
        if rank in failures:
            code = failures[rank]
            words = f"died: {_how(code)}"
            if state is not None and state.get("state") in ("raised", "failed"):
                words += f"; {_state_words(state)}"
            elif state is not None:
                words += f"; it was {_state_words(state)}"
            elif line:
                words += f", at {line}"
            if code == -signal.SIGABRT and frames and not line_is_user(frames[0], libs):
                aborted.append(rank)
                words += " (inside a collective)"
            lines.append(f"rank {rank}: {words}")
            if code < 0 and frames:  # a crash: its faulthandler dump, main thread
                lines.append(f"  rank {rank}'s stack (most recent first):")
                lines.extend(f"    {f}" for f in frames[:12])
        elif state is not None:
            lines.append(f"rank {rank}: {_state_words(state)}")
        elif line:
            lines.append(f"rank {rank}: running at {line} when the launcher stopped it")
        else:
            lines.append(f"rank {rank}: stopped by the launcher (it left no state or stack)")
    if aborted:
        who = ", ".join(f"rank {r}" for r in aborted)
        lines.append(MISMATCH_SENTENCE.format(who=who))
    return lines


def line_is_user(frame: str, libs: tuple[str, ...]) -> bool:
    return innermost_user_line([frame], libs) is not None


def flight_records(folder: str, timeout: float = 120.0) -> list[str]:
    """NCCL's flight records of a failed job, read by PyTorch's own analyser
    (``torch.distributed.flight_recorder``): the collective where the ranks diverge."""
    dumps = flight_recorder_folder(folder)
    if dumps is None:
        return []
    command = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", dumps,
               "--prefix", "rank_", "--allow-incomplete-ranks"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"NCCL flight records are in {dumps}; reading them failed ({exc})."]
    text = (done.stdout + done.stderr).strip().splitlines()
    return [f"NCCL flight records ({dumps}), read by torch.distributed.flight_recorder:",
            *[f"  {line}" for line in text[-40:]]]
