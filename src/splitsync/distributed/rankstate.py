"""What each rank leaves behind when a job fails: its state and its stacks, in one folder.

``splitsync run`` gives its workers a folder (``SPLITSYNC_STATE_DIR``). A rank writes
``rank<N>.json`` when it learns where it stands at a failure (waiting in which collective,
running where, which exception it raised), and its Python stacks go to ``rank<N>.stacks``
(``faulthandler``: a crash, the launcher's stop signal, a dump on request). After the job the
launcher reads both and prints one line per rank. Under torchrun or srun there is no folder:
the ranks print what they know themselves. Standard library only: the launcher reads these
without importing torch.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["STATE_DIR_VAR", "FLIGHT_RECORDER_ENTRIES", "flight_recorder_env",
           "flight_recorder_folder", "state_dir", "state_path", "stacks_path", "write_state",
           "read_state", "innermost_user_line", "main_thread_block"]

STATE_DIR_VAR = "SPLITSYNC_STATE_DIR"
#: Collectives NCCL's flight recorder keeps per rank under ``splitsync run``.
FLIGHT_RECORDER_ENTRIES = 2000
_FR_NOTE = "flight_recorder.path"  # in the state folder: where the ranks' dumps go
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.IGNORECASE)


def state_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The folder the launcher gave this job's ranks, or None (torchrun, srun, spawn)."""
    value = (os.environ if environ is None else environ).get(STATE_DIR_VAR, "")
    return value if value and os.path.isdir(value) else None


def state_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.json")


def stacks_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.stacks")


def write_state(folder: str | None, rank: int, state: dict[str, Any],
                keep: bool = False) -> None:
    """Write this rank's state (atomically); ``keep=True`` leaves an earlier one in place
    (the first account of a failure is the cause, later ones its consequences)."""
    if folder is None:
        return
    path = state_path(folder, rank)
    if keep and os.path.exists(path):
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)
    except OSError:  # the folder went away with the launcher: nothing left to tell
        pass


def read_state(folder: str, rank: int) -> dict[str, Any] | None:
    try:
        with open(state_path(folder, rank)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main_thread_block(text: str, main_ident: int | None = None) -> list[str]:
    """The frames (most recent first) of one thread of a ``faulthandler`` dump: the thread
    ``main_ident`` if given and present, else the last one written (the oldest thread, which
    is the main thread of a process that started the others)."""
    blocks: list[tuple[int | None, list[str]]] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            blocks.append((int(head.group(1), 16), []))
        elif blocks and _FRAME.match(line):
            blocks[-1][1].append(line.strip())
    if not blocks:
        return []
    for ident, frames in blocks:
        if main_ident is not None and ident == main_ident:
            return frames
    return blocks[-1][1]


def innermost_user_line(frames: list[str], library_dirs: tuple[str, ...]) -> str | None:
    """``file:line`` of the first frame (most recent first) outside ``library_dirs``."""
    for frame in frames:
        m = _FRAME.match(frame)
        if m is None:
            continue
        path = m.group("file")
        if path.startswith("<") or os.path.abspath(path).startswith(library_dirs):
            continue
        return f"{_short(path)}:{m.group('line')}"
    return None


def _short(path: str) -> str:
    full = os.path.abspath(path)
    cwd = os.getcwd() + os.sep
    return full[len(cwd):] if full.startswith(cwd) else full


def flight_recorder_env(environ: Mapping[str, str], backend: str, run_dir: str | None,
                        rank: int) -> dict[str, str]:
    """The variables that turn NCCL's flight recorder on (only what the user has not set),
    under ``splitsync run`` with NCCL: the last collectives of every rank, dumped when one
    times out, under ``run_dir/flight_recorder`` (else the job's state folder, which the
    launcher reads after a failure). Elsewhere (torchrun, srun, gloo) nothing."""
    folder = state_dir(environ)
    if folder is None or backend != "nccl":
        return {}
    dumps = os.path.join(run_dir if run_dir else folder, "flight_recorder")
    os.makedirs(dumps, exist_ok=True)
    if rank == 0:
        with open(os.path.join(folder, _FR_NOTE), "w") as f:
            f.write(dumps)
    wanted = {"TORCH_FR_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
              "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
              "TORCH_FR_DUMP_TEMP_FILE": os.path.join(dumps, "rank_")}
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" in environ:  # the older name of the buffer's size
        wanted.pop("TORCH_FR_BUFFER_SIZE")
    return {k: v for k, v in wanted.items() if k not in environ}


def flight_recorder_folder(folder: str) -> str | None:
    """Where the ranks of a ``splitsync run`` job dumped their flight records, if any."""
    try:
        with open(os.path.join(folder, _FR_NOTE)) as f:
            dumps = f.read().strip()
    except OSError:
        return None
    return dumps if os.path.isdir(dumps) and os.listdir(dumps) else None
