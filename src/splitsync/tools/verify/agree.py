"""The global batch every launch of ``splitsync verify`` trains at, agreed through files.

Launches start together and each may see another world size, strategy or accumulation. A
script may give ``run.loader`` a fixed per-process batch (``batch_size=16``), derive it from
the world size (``64 // run.world_size``), or derive its accumulation from it, as nanoGPT
does (``init(accumulate=lambda world_size: 8 // world_size)``). No launch alone can tell
which, so one launch is the reference: the script as the user runs it. Its rank 0 publishes the global
batch of one optimizer step, G = per-process batch x accumulation x world size (or
``--batch`` B x accumulation). Every other launch trains at the same G, with a per-process
micro-batch of G / (its accumulation x its world size): at 1 process with accumulation 8
against 2 x 4, the micro-batch stays what the script gave; a per-process batch of 16 at 2
processes becomes 32 at one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

__all__ = ["publish", "read_global", "per_rank", "EXITED", "REF"]

EXITED = "exited-{label}"  # written by verify when the launch with that label has ended
REF = "ref"  # the reference launch's label


def _file(shared: Path, index: int) -> Path:
    return shared / f"batch{index}.json"


def publish(shared: Path, index: int, global_batch: int) -> None:
    """The reference launch's rank 0: the global batch of its ``index``-th shuffled loader."""
    path = _file(shared, index)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"global": global_batch}))
    os.replace(tmp, path)


def read_global(shared: Path, index: int, timeout: float) -> int:
    """The reference's global batch for loader ``index`` (waits until it is published)."""
    path = _file(shared, index)
    ended = shared / EXITED.format(label=REF)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if ended.exists() or time.monotonic() > deadline:
            raise RuntimeError(
                "splitsync verify: the reference run (the script as written) ended (or "
                f"stalled) before it built its training loader (run.loader #{index}), so the "
                "runs cannot agree on a global batch; see its output, or give --batch B.")
        time.sleep(0.05)
    return int(json.loads(path.read_text())["global"])


def per_rank(global_batch: int, accumulate: int, world: int) -> int:
    """The per-process micro-batch that makes ``global_batch`` per optimizer step."""
    parts = accumulate * world
    if global_batch % parts:
        raise ValueError(
            f"splitsync verify: a global batch of {global_batch} samples per optimizer step "
            f"cannot be split into {accumulate} micro-batch(es) x {world} process(es); give "
            f"--batch B with B x accumulation a multiple of {parts}.")
    return global_batch // parts
