"""Finding the checkpoint to resume from: which directory and step ``run.resume`` means, and
the newest checkpoint every rank can read and verify.

Rank 0 lists the checkpoints and checks each manifest and every file's size (cheap). Then
every rank reads, in parallel with the others, the files it needs, hashing them on the way
(:mod:`splitsync.ckpt.load`); only if every rank's files verify is the checkpoint used,
otherwise the next older one is tried and the broken one set aside."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitsync.ckpt.fs import Storage
from splitsync.ckpt.load import load_rank_parts, read_rank_parts
from splitsync.ckpt.store import MANIFEST, STEP_RE, parse_manifest, step_dirname
from splitsync.distributed import comm
from splitsync.errors import CheckpointError, CheckpointWarning

__all__ = ["Listing", "Found", "check_size", "list_candidates", "find_checkpoint", "locate"]


@dataclass(frozen=True)
class Listing:
    """Checkpoints whose manifest and sizes check out (newest first), and those skipped."""

    good: tuple[tuple[str, dict[str, Any]], ...]
    skipped: tuple[tuple[str, str], ...]
    total: int  # committed checkpoints found at all


def check_size(storage: Storage, name: str, rel: str, info: dict[str, Any]) -> None:
    """Raise :class:`CheckpointError` unless file ``rel`` has the size its manifest gives."""
    size = storage.size(name, rel)
    if size is None:
        raise CheckpointError(f"{rel} is missing")
    if size != info["size"]:
        what = "zero bytes" if size == 0 else f"{size} bytes"
        raise CheckpointError(f"{rel} is {what}, the manifest says {info['size']} "
                              "(truncated or overwritten)")


def _check_sizes(storage: Storage, name: str, body: dict[str, Any]) -> None:
    for rel, info in body["files"].items():
        check_size(storage, name, rel, info)


def list_candidates(storage: Storage) -> Listing:
    """Rank 0: every checkpoint, newest first, split into plausible ones and broken ones."""
    good, skipped = [], []
    steps = storage.steps()
    for _, name in steps:
        try:
            body = parse_manifest(storage.read_manifest_text(name))
            _check_sizes(storage, name, body)
            good.append((name, body))
        except CheckpointError as e:
            skipped.append((name, str(e)))
        except (OSError, UnicodeDecodeError) as e:
            skipped.append((name, f"unreadable ({e})"))
    return Listing(tuple(good), tuple(skipped), len(steps))


def _everywhere(attempt: Callable[..., dict[str, Any]],
                *args: Any) -> tuple[dict[str, Any], list[str]]:
    """Collective: ``attempt(*args)`` here; why it failed on any rank ("": nowhere)."""
    err, out = None, {}
    try:
        out = attempt(*args)
    except CheckpointError as e:
        err = str(e)
    except OSError as e:
        err = f"unreadable ({e})"
    return out, [e for e in comm.gather_object(err) if e]


Found = tuple[str, dict[str, Any], dict[str, Any], dict[str, Any] | None]


def _only_step(storage: Storage, listing: Listing, step: int) -> Listing:
    """The listing cut to checkpoint ``step``, which must be there and look complete."""
    name = step_dirname(step)
    if name not in {n for n, _ in (*listing.good, *listing.skipped)}:
        steps = sorted(int(n.split("-")[1]) for n, _ in (*listing.good, *listing.skipped))
        held = ", ".join(map(str, steps)) if steps else "none"
        raise CheckpointError(f"no checkpoint of step {step} in {storage.where('')}: the "
                              f"steps there are {held}.")
    for n, why in listing.skipped:
        if n == name:
            raise CheckpointError(f"checkpoint {storage.where(name)} cannot be resumed: {why}.")
    return Listing(tuple(g for g in listing.good if g[0] == name), (), 1)


def find_checkpoint(storage: Storage, rank: int, world: int,
                    needed: Callable[[Mapping[str, Any]], list[str]],
                    step: int | None = None) -> Found | None:
    """Collective: the newest checkpoint every rank can read and verify (``step``: that one
    or an error), read into memory: (name, manifest body, state.pt contents, this rank's rank
    file or None). None: fresh."""
    listing = list_candidates(storage) if rank == 0 else None
    listing = comm.broadcast_object(listing)
    if step is not None:
        listing = _only_step(storage, listing, step)
    skipped = list(listing.skipped)
    found: Found | None = None
    for name, body in listing.good:
        parts, errors = _everywhere(read_rank_parts, storage, name, body, rank, world,
                                    needed(body))
        if not errors and storage.local:  # every share verified: nothing unverified is read
            parts, errors = _everywhere(load_rank_parts, storage, name, parts)
        if not errors:
            wanted = needed(body)
            found = (name, body, parts[wanted[0]], parts.get(wanted[1]))
            break
        skipped.append((name, errors[0]))
    if rank == 0:
        for name, why in skipped:
            aside = storage.set_aside(name) if found is not None else ""
            # set aside only when something loads: keep-last-k never counts a bad one then
            warnings.warn(f"skipping checkpoint {storage.where(name)}: {why}{aside}",
                          CheckpointWarning, stacklevel=4)
    if found is None and listing.total:
        listing_s = "; ".join(f"{storage.where(n)}: {why}" for n, why in skipped)
        raise CheckpointError(
            f"no usable checkpoint in {storage.where('')}: every one is incomplete or corrupted "
            f"({listing_s}). Move them away to start fresh, or restore a good copy.")
    return found


def locate(where: Any, step: int | None) -> tuple[Any, int | None]:
    """The checkpoint directory and the step ``run.resume(where, step=...)`` asks for. A
    committed step folder (``ckpt/step-000050``, as ``splitsync ckpt`` takes) stands for
    its parent and that step, so saves go next to it, never inside it; a folder that is one
    checkpoint under another name, or a save's work folder, is refused naming the parent."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise TypeError(f"run.resume(..., step={step!r}): give the number of a saved step.")
    text = str(where).rstrip("/")
    url = "://" in text
    name = text.rsplit("/", 1)[-1]
    parent: Any = text.rsplit("/", 1)[0] if url else Path(where).parent
    folder = None if url else Path(where)
    if re.match(r"^\.[a-z-]+-step-\d+$", name):
        raise CheckpointError(f"{text!r} is not a committed checkpoint (a save's work folder "
                              f"or one set aside); pass the checkpoint directory {str(parent)!r}"
                              " (with step=N for one of its steps).")
    holds = folder is not None and (folder / MANIFEST).is_file()
    m = STEP_RE.match(name)
    roots = folder is not None and folder.is_dir() and any(
        STEP_RE.match(p.name) for p in folder.iterdir())
    if m and not roots:  # a step folder (or one that would be): its parent and its step
        if step is not None and step != int(m.group(1)):
            raise CheckpointError(f"run.resume({text!r}, step={step}): the folder is step "
                                  f"{int(m.group(1))}; pass {str(parent)!r} with step={step}.")
        return parent, int(m.group(1))
    if holds:
        raise CheckpointError(
            f"{text!r} holds one checkpoint ({MANIFEST}), not step-* checkpoints: saves would "
            f"go inside it. Pass the directory that holds its step-NNNNNN folder (e.g. "
            f"{str(parent)!r}) with step=N, or copy it into one as step-NNNNNN/.")
    return where, step
