"""Reading checkpoints in one process, without a process group: for ``splitsync ckpt``.

A path names either a checkpoint directory (what ``run.save``/``run.resume`` were given,
holding ``step-NNNNNN/`` folders) or one checkpoint (a folder with a ``manifest.json``),
locally or as an fsspec URL. Every file is checked against the manifest's checksums before
anything in it is interpreted, and pickles load with ``weights_only=True`` only.
"""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitsync.ckpt.find import check_size
from splitsync.ckpt.fs import ObjectStorage, Storage, is_url, open_storage
from splitsync.ckpt.load import read_part, verify_files
from splitsync.ckpt.store import LATEST, MANIFEST, STEP_RE, parse_manifest
from splitsync.errors import CheckpointError

__all__ = ["Location", "Entry", "Check", "locate", "entries", "check", "choose", "state_of",
           "read_latest", "NOT_A_CHECKPOINT"]

_HIDDEN_RE = re.compile(r"^\.(tmp|skipped|old)-step-(\d+)$")
NOT_A_CHECKPOINT = ("expected a checkpoint directory (the one given to run.save / run.resume, "
                    "holding step-NNNNNN/ folders) or one checkpoint folder with a manifest.json")


@dataclass(frozen=True)
class Location:
    """Where the checkpoints are: a storage, and the one checkpoint the path named, if any."""

    path: str
    storage: Storage
    only: str | None = None  # the path was one checkpoint folder (this name in storage)

    def where(self, name: str) -> str:
        return self.storage.where(name)


@dataclass(frozen=True)
class Entry:
    """One folder that is or was a checkpoint: ``status`` is "committed" (it should have a
    manifest), "incomplete" (a save in progress or killed) or "set aside" (by a resume that
    found it damaged)."""

    name: str
    step: int
    status: str


@dataclass(frozen=True)
class Check:
    """A checkpoint's manifest body (None when unreadable) and what is wrong with it."""

    name: str
    body: dict[str, Any] | None
    problems: tuple[str, ...]
    checksums: bool  # whether the checksums were checked at all (not when there is no manifest)

    @property
    def ok(self) -> bool:
        return self.body is not None and not self.problems


def _names(storage: Storage) -> list[str]:
    """Every entry directly under the storage's root (hidden ones included)."""
    if storage.local:
        root = Path(storage.root)
        return [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    assert isinstance(storage, ObjectStorage)
    storage.fs.invalidate_cache()
    try:
        found = storage.fs.ls(storage.root, detail=False)
    except FileNotFoundError:
        return []
    return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in found]


def _exists(storage: Storage, rel: str) -> bool:
    if storage.local:
        return (Path(storage.root) / rel).exists()
    assert isinstance(storage, ObjectStorage)
    return bool(storage.fs.exists(f"{storage.root}/{rel}" if rel else storage.root))


def _parent(path: str) -> tuple[str, str]:
    """(the folder above ``path``, ``path``'s last name), for a path or a URL."""
    stripped = path.rstrip("/")
    if is_url(stripped):
        head, _, name = stripped.rpartition("/")
        return head, name
    p = Path(stripped)
    return str(p.parent), p.name


def locate(path: str | os.PathLike[str]) -> Location:
    """The checkpoints at ``path``; raises CheckpointError naming the path and what was
    expected when it is missing, a file, or a folder with no checkpoint in it."""
    text = str(path)
    storage = open_storage(text)
    if storage.local:
        p = Path(text)
        if not p.exists():
            raise CheckpointError(f"{p}: no such directory; {NOT_A_CHECKPOINT}.")
        if not p.is_dir():
            raise CheckpointError(f"{p} is a file; {NOT_A_CHECKPOINT}.")
    elif not _exists(storage, ""):
        raise CheckpointError(f"{text}: nothing there; {NOT_A_CHECKPOINT}.")
    if _exists(storage, MANIFEST) or STEP_RE.match(_parent(text)[1]) or \
            _HIDDEN_RE.match(_parent(text)[1]):
        parent, name = _parent(text)
        return Location(text, open_storage(parent), only=name)
    loc = Location(text, storage)
    if not entries(loc):
        raise CheckpointError(f"{text} is not a checkpoint: it holds no step-NNNNNN/ folder and "
                              f"no {MANIFEST}; {NOT_A_CHECKPOINT}.")
    return loc


def _entry(name: str) -> Entry | None:
    if m := STEP_RE.match(name):
        return Entry(name, int(m.group(1)), "committed")
    if m := _HIDDEN_RE.match(name):
        status = "set aside" if m.group(1) == "skipped" else "incomplete"
        return Entry(name, int(m.group(2)), status)
    return None


def entries(loc: Location) -> list[Entry]:
    """The checkpoint folders at ``loc``, newest step first. In object storage a ``step-N``
    without a manifest is a save in progress or killed (it has no rename to wait for)."""
    if loc.only is not None:  # named by the user: checked whatever its name says
        found = _entry(loc.only)
        return [Entry(loc.only, found.step if found else -1, "committed")]
    out = [e for e in map(_entry, _names(loc.storage)) if e is not None]
    if not loc.storage.local:
        out = [Entry(e.name, e.step, "incomplete") if not _exists(loc.storage, f"{e.name}/{MANIFEST}")
               else e for e in out]
    return sorted(out, key=lambda e: (e.step, e.status == "committed"), reverse=True)


def read_latest(loc: Location) -> str | None:
    """What ``latest`` names (informational: readers never trust it), or None."""
    if loc.only is not None:
        return None
    try:
        if loc.storage.local:
            data = (Path(loc.storage.root) / LATEST).read_bytes()
        else:
            assert isinstance(loc.storage, ObjectStorage)
            data = loc.storage.fs.cat_file(f"{loc.storage.root}/{LATEST}")
        return bytes(data).decode("utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _manifest(loc: Location, name: str) -> dict[str, Any]:
    try:
        text = loc.storage.read_manifest_text(name)
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{MANIFEST} is unreadable ({e})") from None
    return parse_manifest(text)


def check(loc: Location, name: str, *, load: tuple[str, ...] = (),
          checksums: bool = True) -> tuple[Check, dict[str, Any]]:
    """Check checkpoint ``name``: its manifest, then every file's size and checksums. Files in
    ``load`` are read once, verified and loaded (weights only), returned by name.
    ``checksums=False``: the manifest and the sizes only, nothing read or loaded."""
    try:
        body = _manifest(loc, name)
    except CheckpointError as e:
        return Check(name, None, (str(e),), False), {}
    problems: list[str] = []
    loaded: dict[str, Any] = {}
    for rel, info in sorted(body["files"].items()):
        try:
            check_size(loc.storage, name, rel, info)
            if not checksums:
                continue
            if rel in load:
                loaded[rel] = read_part(loc.storage, name, rel, info)
            else:
                verify_files(loc.storage, name, [rel], body["files"])
        except CheckpointError as e:
            problems.append(str(e))
        except OSError as e:
            problems.append(f"{rel} is unreadable ({e})")
    return Check(name, body, tuple(problems), checksums), loaded


def _damaged(loc: Location, c: Check) -> CheckpointError:
    where = loc.where(c.name)
    if c.body is None:
        return CheckpointError(f"{where} is not a complete checkpoint: {c.problems[0]}; "
                               f"{NOT_A_CHECKPOINT}.")
    return CheckpointError(f"{where} is damaged: " + "; ".join(c.problems))


def choose(loc: Location, step: int | None, *, load: tuple[str, ...] = (),
           skipped: list[tuple[str, str]] | None = None) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The checkpoint to read: step ``step`` (which must verify), or else the newest that
    verifies; the ones passed over on the way are appended to ``skipped`` (name, reason).
    Returns (name, manifest body, the ``load`` files read)."""
    committed = [e for e in entries(loc) if e.status == "committed"]
    if step is not None:
        wanted = [e for e in entries(loc) if e.step == step and e.status != "set aside"]
        if not wanted:
            have = ", ".join(str(e.step) for e in committed) or "none"
            raise CheckpointError(f"{loc.path}: there is no step {step} (committed steps: {have}).")
        committed = wanted[:1]
    for e in committed:
        c, loaded = check(loc, e.name, load=load)
        if c.ok:
            assert c.body is not None
            return e.name, c.body, loaded
        if step is not None or loc.only is not None:
            raise _damaged(loc, c)
        if skipped is not None:
            skipped.append((loc.where(e.name), "; ".join(c.problems)))
    raise CheckpointError(f"{loc.path}: no complete checkpoint verifies"
                          + (f" ({'; '.join(f'{n}: {w}' for n, w in skipped)})" if skipped else "")
                          + "; restore a good copy.")


def state_of(loc: Location, name: str, loaded: dict[str, Any]) -> Any:
    """The verified contents of ``state.pt`` (loaded by :func:`check`)."""
    from splitsync.ckpt.save import STATE_FILE

    if STATE_FILE not in loaded:
        raise CheckpointError(f"{loc.where(name)}: {STATE_FILE} is not in the manifest")
    return loaded[STATE_FILE]


def local_dir(loc: Location, name: str) -> Path:
    """The local folder of checkpoint ``name``; sharded state is read from a filesystem path
    (torch.distributed.checkpoint's reader), so a URL is refused with what to do instead."""
    if not loc.storage.local:
        raise CheckpointError(f"{loc.where(name)}: sharded (DCP) checkpoints are read from a "
                              "filesystem path, not from object storage; copy the folder to a "
                              "local disk first (e.g. `aws s3 sync`).")
    return Path(loc.storage.root) / name


def refused(where: str, e: pickle.UnpicklingError) -> CheckpointError:
    """The error for DCP metadata or values that hold more than plain data."""
    return CheckpointError(f"{where}: refused to unpickle it ({e}); it holds objects that could "
                           "run code. Only read checkpoints you trust.")
