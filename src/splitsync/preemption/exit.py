"""The exit protocol ``splitsync run`` reads: the exit code of a stopped process, and the
notes a stopped worker leaves for the launcher (:func:`write_note`, :func:`read_notes`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["PREEMPTED_EXIT_CODE", "NOTES_VAR", "FAILURE_NOTE", "write_note", "read_notes",
           "failure_marked"]

#: The exit code of a process stopped by a preemption (EX_TEMPFAIL in sysexits.h: "a
#: temporary failure; try again later"). Launching the same command again resumes.
PREEMPTED_EXIT_CODE = 75

#: Set by ``splitsync run`` for its workers: a folder where a stopped worker leaves a note,
#: so that the launcher exits with PREEMPTED_EXIT_CODE (see :func:`write_note`).
NOTES_VAR = "SPLITSYNC_STOP_NOTES"


def write_note(environ: Mapping[str, str], rank: int, record: Mapping[str, Any]) -> bool:
    """Under ``splitsync run``, leave ``record`` for the launcher (atomically); returns
    whether there was a launcher to tell."""
    folder = environ.get(NOTES_VAR)
    if not folder or not os.path.isdir(folder):
        return False
    path = Path(folder) / f"rank-{rank:05d}.json"
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps({**record, "rank": rank, "time": time.time()}))
    os.replace(part, path)
    return True


def read_notes(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The notes the workers left, in rank order (unreadable ones are skipped)."""
    notes = []
    for path in sorted(Path(folder).glob("rank-*.json")):
        try:
            notes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return notes


#: Left in the notes folder by ``splitsync run`` while torchrun's agent stops the workers
#: because one of them failed (to restart them, or for good): the SIGTERM the others then
#: get is not a preemption, and waiting for a stop step a dead rank never reaches would only
#: delay the restart by the grace period.
FAILURE_NOTE = "failure"


def failure_marked(environ: Mapping[str, str]) -> bool:
    """Whether ``splitsync run`` is stopping the workers after a failure (see FAILURE_NOTE)."""
    folder = environ.get(NOTES_VAR)
    return bool(folder) and (Path(folder) / FAILURE_NOTE).exists()
