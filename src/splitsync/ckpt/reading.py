"""Finding the checkpoint to resume from and reading its files, verified while they are read.

Rank 0 lists the checkpoints and checks each manifest and every file's size (cheap). Then
every rank reads, in parallel with the others, the files it needs, hashing them on the way;
only if every rank's files verify is the checkpoint used, otherwise the next older one is
tried. Nothing is unpickled before its bytes match the manifest's checksums.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from splitsync.ckpt.chunked import load_bytes, read_verified, refused
from splitsync.ckpt.digest import verify_fd
from splitsync.ckpt.fs import Storage
from splitsync.ckpt.store import CheckpointError, parse_manifest
from splitsync.distributed import comm
from splitsync.errors import CheckpointWarning

__all__ = ["CheckpointWarning", "Listing", "check_size", "list_candidates", "read_part", "verify_files",
           "find_checkpoint", "prefetch"]


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


def read_part(storage: Storage, name: str, rel: str, info: dict[str, Any]) -> Any:
    """One ``torch.save`` file of checkpoint ``name``, verified, then loaded (weights only).

    A local file is read and hashed once, chunks by several threads at once, and then
    memory-mapped: its pages are in the page cache by then, so it is neither read from the
    disk nor copied a second time. From object storage the verified bytes are loaded.
    """
    if storage.local:
        _verify_local(Path(storage.root) / name / rel, rel, info)
        return _load_local(storage, name, rel)
    with storage.open(name, rel) as f:
        return load_bytes(read_verified(f, rel, info), rel)


def _load_local(storage: Storage, name: str, rel: str) -> Any:
    """A local file whose bytes were verified (by this rank, or in shares by every rank)."""
    import pickle

    try:  # mapped, so the tensors are not copied again
        return torch.load(Path(storage.root) / name / rel, map_location="cpu",
                          weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        raise refused(rel, e) from None


def _verify_local(path: Path, label: str, info: dict[str, Any],
                  share: tuple[int, int] = (0, 1)) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        verify_fd(fd, label, info, share)
    finally:
        os.close(fd)


def verify_files(storage: Storage, name: str, rels: Iterable[str],
                 files: dict[str, dict[str, Any]]) -> None:
    """Hash ``rels`` without loading them (files another library reads, e.g. DCP shards)."""
    for rel in rels:
        if storage.local:
            _verify_local(Path(storage.root) / name / rel, rel, files[rel])
        else:
            with storage.open(name, rel) as f:
                read_verified(f, rel, files[rel])


def prefetch(storage: Storage, name: str, rels: Iterable[str]) -> None:
    """Ask the kernel to read these files ahead, all of them, now: the disk streams at its
    own speed while this thread hashes and loads what has arrived, so a busy CPU (one core
    taken by another process) no longer leaves the disk idle between our reads."""
    if not storage.local or not hasattr(os, "posix_fadvise"):
        return
    paths = [Path(storage.root) / name / rel for rel in rels]

    def advise() -> None:  # on a thread: the kernel may block while it queues the reads
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue  # reported by the read itself
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    threading.Thread(target=advise, name="ckpt-readahead", daemon=True).start()


def _read_rank_parts(storage: Storage, name: str, body: Mapping[str, Any], rank: int,
                     world: int, needed: list[str]) -> dict[str, Any]:
    """Verify (and from object storage, load) the files this rank needs. Local files are
    only verified here, and loaded by :func:`_load_rank_parts` once every rank's verify: the
    first needed file, which every rank reads (``state.pt``), is hashed in shares, each rank
    its own run of chunks, so that n ranks hash it once between them, not n times."""
    files = body["files"]
    # Files nobody loads here (DCP shards, which DCP reads itself) are verified in parallel,
    # each by one rank; which rank reads which shard is DCP's business.
    others = sorted(r for r in files if r.startswith("dcp/"))[rank::world]
    mine = [rel for rel in needed if rel in files]
    prefetch(storage, name, [*mine, *others])
    if not storage.local:
        out = {rel: read_part(storage, name, rel, files[rel]) for rel in mine}
    else:
        for rel in mine:
            shared = bool(needed) and rel == needed[0]
            _verify_local(Path(storage.root) / name / rel, rel, files[rel],
                          (rank, world) if shared else (0, 1))
        out = dict.fromkeys(mine)
    verify_files(storage, name, others, files)
    return out


def _everywhere(attempt: Callable[..., dict[str, Any]],
                *args: Any) -> tuple[dict[str, Any], list[str]]:
    """Collective: ``attempt(*args)`` on this rank, and why it failed on any rank (empty:
    nowhere)."""
    err, out = None, {}
    try:
        out = attempt(*args)
    except CheckpointError as e:
        err = str(e)
    except OSError as e:
        err = f"unreadable ({e})"
    return out, [e for e in comm.gather_object(err) if e]


def _load_rank_parts(storage: Storage, name: str, parts: dict[str, Any]) -> dict[str, Any]:
    """The local files :func:`_read_rank_parts` verified, loaded (from object storage they
    are loaded already)."""
    if not storage.local:
        return parts
    return {rel: _load_local(storage, name, rel) for rel in parts}


Found = tuple[str, dict[str, Any], dict[str, Any], dict[str, Any] | None]


def find_checkpoint(storage: Storage, rank: int, world: int,
                    needed: Callable[[Mapping[str, Any]], list[str]]) -> Found | None:
    """Collective: the newest checkpoint every rank can read and verify, read into memory:
    (name, manifest body, state.pt contents, this rank's rank file or None). None: fresh."""
    listing = list_candidates(storage) if rank == 0 else None
    listing = comm.broadcast_object(listing)
    skipped = list(listing.skipped)
    found: Found | None = None
    for name, body in listing.good:
        parts, errors = _everywhere(_read_rank_parts, storage, name, body, rank, world,
                                    needed(body))
        if not errors and storage.local:  # every share verified: nothing unverified is read
            parts, errors = _everywhere(_load_rank_parts, storage, name, parts)
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
