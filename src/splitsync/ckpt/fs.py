"""Where checkpoints live: a local directory (atomic rename) or an fsspec URL (no rename).

Local directories keep the rename protocol of :mod:`.store`: a save writes ``.tmp-step-N/``
and renames it into place. Object stores (``s3://``, ``gs://``, fsspec's ``memory://`` and
``file://``, ...) cannot rename, so a save writes ``step-N/`` directly and the checkpoint
exists only once its manifest does; ``latest`` is written after the manifest, and a
``step-N/`` without a manifest is a dead save that the next save removes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from splitsync.ckpt import store
from splitsync.ckpt.store import LATEST, MANIFEST
from splitsync.errors import CheckpointError

__all__ = ["Storage", "LocalStorage", "ObjectStorage", "is_url", "open_storage", "open_dir"]

# Object stores upload in parts of this size (s3fs multipart); large parts, few requests.
_BLOCK = 64 << 20


def is_url(where: str | os.PathLike[str]) -> bool:
    """``s3://bucket/x`` and other fsspec URLs (but not Windows drive letters)."""
    return isinstance(where, str) and "://" in where


class Storage(Protocol):
    """The few operations a save and a resume need, on a local directory or an object store."""

    root: Any
    local: bool

    def where(self, name: str) -> str: ...
    def work_name(self, step: int) -> str: ...
    def prepare(self, step: int) -> None: ...
    def create(self, work: str, rel: str) -> BinaryIO: ...
    def durable(self, f: BinaryIO) -> None: ...
    def put_manifest(self, work: str, text: str) -> None: ...
    def commit(self, work: str, step: int) -> str: ...
    def prune(self, keep: int, newest: str) -> None: ...
    def steps(self) -> list[tuple[int, str]]: ...
    def read_manifest_text(self, name: str) -> str: ...
    def size(self, name: str, rel: str) -> int | None: ...
    def open(self, name: str, rel: str) -> BinaryIO: ...
    def set_aside(self, name: str, prefix: str = ".skipped-") -> str: ...
    def discard(self, work: str) -> None: ...
    def free_bytes(self) -> int | None: ...


def open_storage(where: str | os.PathLike[str]) -> Storage:
    """The storage for ``where``: a URL goes through fsspec (optional extra), a path is local."""
    if is_url(where):
        return ObjectStorage(str(where))
    return LocalStorage(Path(where))


def open_dir(where: str | os.PathLike[str]) -> Storage:
    """The storage of a run's checkpoint directory; a path that is a file is refused at once
    (not found out at the first save, after training from scratch)."""
    path = Path(where)
    if "://" not in str(where) and path.exists() and not path.is_dir():
        raise CheckpointError(
            f"checkpoint directory {str(path)!r} is a regular file, not a directory: pass the "
            "directory that holds (or will hold) the step-* checkpoints, e.g. "
            f"{str(path.parent / 'ckpt')!r}.")
    return open_storage(where)


class LocalStorage:
    """A local (or shared POSIX) directory: write a work directory, fsync, rename into place."""

    local = True

    def __init__(self, root: Path) -> None:
        self.root = root

    def where(self, name: str) -> str:
        return str(self.root / name)

    def work_name(self, step: int) -> str:
        return store.tmp_dirname(step)

    def prepare(self, step: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        store.clear_stale(self.root)
        (self.root / self.work_name(step)).mkdir()

    def create(self, work: str, rel: str) -> BinaryIO:
        path = self.root / work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "wb")  # noqa: SIM115 - closed by the caller

    def durable(self, f: BinaryIO) -> None:
        f.flush()
        os.fsync(f.fileno())

    def put_manifest(self, work: str, text: str) -> None:
        tmp = self.root / work
        for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, reverse=True):
            store.fsync_dir(d)  # every rank's file entries are durable before the manifest
        store._write_atomic(tmp / MANIFEST, text)

    def commit(self, work: str, step: int) -> str:
        return store.commit(self.root / work, self.root, step).name

    def discard(self, work: str) -> None:
        """Remove a work directory that will never be committed (frees a full disk)."""
        shutil.rmtree(self.root / work, ignore_errors=True)

    def free_bytes(self) -> int | None:
        try:
            return shutil.disk_usage(self.root).free
        except OSError:
            return None

    def prune(self, keep: int, newest: str) -> None:
        store.prune(self.root, keep, self.root / newest)

    def steps(self) -> list[tuple[int, str]]:
        return [(s, p.name) for s, p in store.committed_steps(self.root)]

    def read_manifest_text(self, name: str) -> str:
        mf = self.root / name / MANIFEST
        if not mf.is_file():
            raise CheckpointError(f"{MANIFEST} is missing (the save did not finish)")
        return mf.read_text(encoding="utf-8")

    def size(self, name: str, rel: str) -> int | None:
        p = self.root / name / rel
        return p.stat().st_size if p.is_file() else None

    def open(self, name: str, rel: str) -> BinaryIO:
        return open(self.root / name / rel, "rb", buffering=0)  # noqa: SIM115

    def set_aside(self, name: str, prefix: str = ".skipped-") -> str:
        return store.set_aside(self.root / name, prefix)


class ObjectStorage:
    """An fsspec filesystem without rename: the manifest is the commit."""

    local = False

    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError:
            raise CheckpointError(
                f"{url}: checkpoints in object storage need fsspec (and s3fs for s3://); "
                "install splitsync[s3].") from None
        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.root = root.rstrip("/")

    def _p(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def work_name(self, step: int) -> str:
        return store.step_dirname(step)

    def _has_manifest(self, name: str) -> bool:
        return bool(self.fs.exists(self._p(name, MANIFEST)))

    def _remove(self, name: str) -> None:
        # The manifest goes first: a half-removed checkpoint is never taken as complete.
        if self._has_manifest(name):
            self.fs.rm(self._p(name, MANIFEST))
        try:
            self.fs.rm(self._p(name), recursive=True)
        except FileNotFoundError:
            pass

    def prepare(self, step: int) -> None:
        self.fs.invalidate_cache()
        self.fs.makedirs(self.root, exist_ok=True)
        target = self.work_name(step)
        for _, name in self.steps():
            if name == target or not self._has_manifest(name):
                self._remove(name)  # dead saves, or the step being saved again
        self.fs.invalidate_cache()

    def _is_local_fs(self) -> bool:
        from fsspec.implementations.local import LocalFileSystem

        return isinstance(self.fs, LocalFileSystem)

    def _block(self) -> dict[str, int]:
        return {} if self._is_local_fs() or "memory" in str(self.fs.protocol) else \
            {"block_size": _BLOCK}

    def create(self, work: str, rel: str) -> BinaryIO:
        if self._is_local_fs():  # only local directories must exist before a file in them
            self.fs.makedirs(self._p(work, *rel.split("/")[:-1]), exist_ok=True)
        return self.fs.open(self._p(work, rel), "wb", **self._block())

    def durable(self, f: BinaryIO) -> None:
        f.flush()
        fileno = getattr(f, "fileno", None)
        if fileno is not None:  # fsspec's local files are real files: fsync them too
            try:
                os.fsync(fileno())
            except (OSError, ValueError, AttributeError, NotImplementedError, TypeError):
                pass

    def put_manifest(self, work: str, text: str) -> None:
        self.fs.pipe_file(self._p(work, MANIFEST), text.encode())

    def discard(self, work: str) -> None:
        """Remove what was written of a checkpoint that will never be committed."""
        try:
            self._remove(work)
        except Exception:  # best effort: the next save's prepare removes leftovers too
            pass

    def free_bytes(self) -> int | None:
        return None  # object stores do not say

    def commit(self, work: str, step: int) -> str:
        self.fs.pipe_file(self._p(LATEST), (work + "\n").encode())
        return work

    def prune(self, keep: int, newest: str) -> None:
        committed = [n for _, n in self.steps() if self._has_manifest(n)]
        for name in committed[keep:]:
            if name != newest:
                self._remove(name)

    def steps(self) -> list[tuple[int, str]]:
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for e in entries:
            name = str(e).rstrip("/").rsplit("/", 1)[-1]
            m = store.STEP_RE.match(name)
            if m:
                found.append((int(m.group(1)), name))
        return sorted(found, reverse=True)

    def read_manifest_text(self, name: str) -> str:
        try:
            return self.fs.cat_file(self._p(name, MANIFEST)).decode("utf-8")
        except FileNotFoundError:
            raise CheckpointError(f"{MANIFEST} is missing (the save did not finish; "
                                  "the next save removes it)") from None

    def size(self, name: str, rel: str) -> int | None:
        try:
            return int(self.fs.size(self._p(name, rel)))
        except FileNotFoundError:
            return None

    def open(self, name: str, rel: str) -> BinaryIO:
        return self.fs.open(self._p(name, rel), "rb", **self._block())

    def set_aside(self, name: str, prefix: str = ".skipped-") -> str:
        # No rename: drop the manifest, which makes it a dead save the next save removes.
        if self._has_manifest(name):
            self.fs.rm(self._p(name, MANIFEST))
        return "; its manifest was removed and the next save deletes it"

