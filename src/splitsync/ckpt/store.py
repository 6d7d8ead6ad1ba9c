"""Checkpoint directories on disk: atomic commit, verifiable manifest, ``latest``, keep-last-k.

A checkpoint is written into ``.tmp-step-000123/`` next to the committed ones; every file is
fsynced, then ``manifest.json`` (size and chunk checksums of every file, see :mod:`.digest`,
plus the run's position) is written last, the directory is renamed to ``step-000123/`` and
only then is ``latest`` updated. A crash at any moment leaves every earlier committed checkpoint untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from splitsync.errors import CheckpointError

__all__ = [
    "MANIFEST", "LATEST", "FORMAT", "step_dirname", "tmp_dirname",
    "fsync_file", "fsync_dir", "write_manifest", "read_manifest",
    "commit", "prune", "set_aside", "committed_steps", "clear_stale",
    "manifest_text", "parse_manifest", "STEP_RE",
]

MANIFEST = "manifest.json"
LATEST = "latest"
FORMAT = 1
STEP_RE = re.compile(r"^step-(\d+)$")

def step_dirname(step: int) -> str:
    """``step-000123``: zero-padded so names sort like numbers."""
    return f"step-{step:06d}"


def tmp_dirname(step: int) -> str:
    """Hidden work directory for a checkpoint being written."""
    return f".tmp-{step_dirname(step)}"


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (a rename is durable only after this)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories; nothing more to do there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _body_digest(body: dict[str, Any]) -> str:
    # A few kilobytes: SHA-256 costs nothing here, and old manifests keep verifying.
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    with open(part, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)
    fsync_dir(path.parent)


def manifest_text(body: dict[str, Any], files: dict[str, dict[str, Any]]) -> str:
    """The manifest document: ``body`` plus the entries of ``files``, with its own digest."""
    full = {"format": FORMAT, **body, "files": dict(sorted(files.items()))}
    # The manifest carries its own digest, so a flipped bit in it is caught too.
    return json.dumps({"body": full, "sha256": _body_digest(full)}, indent=1, sort_keys=True)


def parse_manifest(text: str) -> dict[str, Any]:
    """The body of a manifest document; raises CheckpointError saying what is wrong."""
    if not text:
        raise CheckpointError(f"{MANIFEST} is zero bytes")
    try:
        doc = json.loads(text)
        body, digest = doc["body"], doc["sha256"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{MANIFEST} is unreadable ({type(e).__name__}: {e})") from None
    if _body_digest(body) != digest:
        raise CheckpointError(f"{MANIFEST} fails its own checksum (corrupted)")
    if body.get("format") != FORMAT:
        raise CheckpointError(f"{MANIFEST} has format {body.get('format')!r}, expected {FORMAT}")
    return body


def write_manifest(tmp: Path, body: dict[str, Any]) -> dict[str, Any]:
    """Checksum every file under ``tmp`` and write the manifest (the last file written)."""
    from splitsync.ckpt.integrity import digest_path  # it imports this module

    files: dict[str, dict[str, Any]] = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            fsync_file(p)
            files[p.relative_to(tmp).as_posix()] = digest_path(p)
    for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, reverse=True):
        fsync_dir(d)
    text = manifest_text(body, files)
    _write_atomic(tmp / MANIFEST, text)
    return parse_manifest(text)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest body of checkpoint ``path``; raises CheckpointError saying what is wrong."""
    mf = path / MANIFEST
    if not mf.is_file():
        raise CheckpointError(f"{MANIFEST} is missing (the save did not finish)")
    try:
        text = mf.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{MANIFEST} is unreadable ({type(e).__name__}: {e})") from None
    return parse_manifest(text)


def committed_steps(root: Path) -> list[tuple[int, Path]]:
    """Committed checkpoint directories under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if p.is_dir() and (m := STEP_RE.match(p.name))]
    return sorted(found, reverse=True)


def clear_stale(root: Path) -> None:
    """Remove work directories left behind by saves that were killed."""
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and p.name.startswith((".tmp-step-", ".old-step-")):
                shutil.rmtree(p, ignore_errors=True)


def set_aside(path: Path, prefix: str = ".skipped-") -> str:
    """Rename a checkpoint to ``<prefix><name>`` (kept for inspection, never loaded): a bad
    one to ``.skipped-``, one a resume went back past to ``.rolled-back-``."""
    target = path.with_name(f"{prefix}{path.name}")
    try:
        shutil.rmtree(target, ignore_errors=True)
        os.rename(path, target)
    except OSError as e:
        return f" (could not move it aside: {e})"
    return f"; moved to {target.name}"


def commit(tmp: Path, root: Path, step: int) -> Path:
    """Rename the finished work directory into place, then point ``latest`` at it."""
    final = root / step_dirname(step)
    old = None
    if final.exists():  # saving the same step again (e.g. after a resume): replace it
        old = root / f".old-{final.name}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(root)
    _write_atomic(root / LATEST, final.name + "\n")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def prune(root: Path, keep: int, newest: Path) -> list[Path]:
    """Delete committed checkpoints beyond the ``keep`` newest; never ``newest`` itself."""
    removed = []
    for _, path in committed_steps(root)[keep:]:
        if path != newest:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
