"""The global batch both sides of ``splitsync verify script.py`` use, agreed through files.

The 1-process and N-process runs start together. A script may give ``run.loader`` a fixed
per-process batch (``batch_size=16``) or derive it from the world size
(``batch_size=64 // run.world_size``); neither run alone can tell which, so each run's rank 0
writes the batch size it was given and both read the other's before choosing B:

- the same size at 1 and N processes: a per-process batch, B = size x N;
- the N-process size is the 1-process size / N: a global batch split by the script, B = it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

__all__ = ["global_batch", "choose", "EXITED"]

EXITED = "exited-{world}"  # written by verify when the run at that world size has ended


def choose(one: int, many: int, nproc: int) -> int:
    """B from the script's batch size at 1 process (``one``) and at ``nproc`` (``many``)."""
    if one == many:
        return one * nproc
    if one == many * nproc:
        return one
    raise ValueError(
        f"splitsync verify: the script's batch size is {one} at 1 process and {many} at "
        f"{nproc}, which is neither a per-process batch nor a global batch split over the "
        f"processes; give the global batch with --batch B (a multiple of {nproc}).")


def global_batch(shared: Path, index: int, own: int, rank: int, world: int, nproc: int,
                 timeout: float) -> int:
    """Publish this run's batch size for its ``index``-th shuffled loader, read the other
    run's and return B (same answer on both sides and every rank)."""
    mine = shared / f"batch{index}-w{world}.json"
    if rank == 0:
        tmp = mine.with_suffix(".tmp")
        tmp.write_text(json.dumps(own))
        os.replace(tmp, mine)
    other_world = nproc if world == 1 else 1
    theirs = shared / f"batch{index}-w{other_world}.json"
    ended = shared / EXITED.format(world=other_world)
    deadline = time.monotonic() + timeout
    while not theirs.exists():
        if ended.exists() or time.monotonic() > deadline:
            raise RuntimeError(
                f"splitsync verify: the {other_world}-process run ended (or stalled) before "
                f"it built its training loader (run.loader #{index}), so the two runs cannot "
                "agree on a global batch; see its output, or give --batch B.")
        time.sleep(0.05)
    other = int(json.loads(theirs.read_text()))
    one, many = (own, other) if world == 1 else (other, own)
    return choose(one, many, nproc)
