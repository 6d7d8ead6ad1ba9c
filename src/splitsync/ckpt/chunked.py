"""Large sequential reads and writes that compute SHA-256 on the way, in a second thread.

hashlib and file I/O both release the GIL on large buffers, so hashing one chunk runs while
the same chunk is written (or the next one is read): the checksum costs no extra pass over
the data and, with two cores, almost no extra time.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import torch

from splitsync.ckpt.store import CheckpointError

__all__ = ["CHUNK", "HashingWriter", "write_object", "read_verified", "load_bytes", "refused"]

CHUNK = 16 << 20
_INLINE = 1 << 20  # smaller pieces are hashed inline: a thread hop would cost more


class HashingWriter(io.RawIOBase):
    """A write-only file object that hashes and counts what passes through to ``raw``."""

    def __init__(self, raw: BinaryIO, pool: ThreadPoolExecutor) -> None:
        super().__init__()
        self.raw = raw
        self.pool = pool
        self.hash = hashlib.sha256()
        self.size = 0
        self._flushed = 0
        try:  # a real file: its dirty pages can be sent to the disk while we go on
            self._fd: int | None = raw.fileno() if hasattr(os, "posix_fadvise") else None
        except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
            self._fd = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        n = len(view)
        if n < _INLINE:
            self.hash.update(view)
            self.raw.write(view)
        else:
            for start in range(0, n, CHUNK):
                piece = view[start:start + CHUNK]
                pending = self.pool.submit(self.hash.update, piece)
                self.raw.write(piece)
                pending.result()  # ``data`` may be a temporary buffer: done with it here
        self.size += n
        if self._fd is not None and self.size - self._flushed >= CHUNK:
            self._start_writeback()
        return n

    def _start_writeback(self) -> None:
        # Linux starts (without waiting for) write-back of a range given POSIX_FADV_DONTNEED,
        # so the disk works while the next chunks are hashed; the final fsync waits for less.
        self.raw.flush()
        try:
            os.posix_fadvise(self._fd, self._flushed, self.size - self._flushed,  # type: ignore[arg-type]
                             os.POSIX_FADV_DONTNEED)
        except OSError:
            self._fd = None
        self._flushed = self.size

    def flush(self) -> None:
        self.raw.flush()


def write_object(create: Callable[[], BinaryIO], durable: Callable[[BinaryIO], None],
                 obj: Any) -> dict[str, Any]:
    """``torch.save(obj)`` into a new file; returns its size and SHA-256 (made while writing)."""
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-hash") as pool, create() as raw:
        w = HashingWriter(raw, pool)
        torch.save(obj, w)
        durable(raw)
    return {"size": w.size, "sha256": w.hash.hexdigest()}


def read_verified(f: BinaryIO, name: str, info: dict[str, Any]) -> bytearray:
    """All of ``f`` in large reads, hashed while the next chunk is read; checked against
    ``info`` (the manifest's size and SHA-256) before anything may interpret the bytes."""
    size = int(info["size"])
    buf = bytearray(size)
    view = memoryview(buf)
    h = hashlib.sha256()
    got = 0
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-hash") as pool:
        pending = None
        while got < size:
            n = f.readinto(view[got:got + CHUNK]) if hasattr(f, "readinto") else None
            if n is None:  # some fsspec files only offer read()
                chunk = f.read(min(CHUNK, size - got))
                n = len(chunk)
                view[got:got + n] = chunk
            if not n:
                break
            if pending is not None:
                pending.result()
            pending = pool.submit(h.update, view[got:got + n])
            got += n
        if pending is not None:
            pending.result()
    if got != size or f.read(1):
        raise CheckpointError(f"{name} is not {size} bytes as the manifest says "
                              "(truncated or overwritten)")
    if h.hexdigest() != info["sha256"]:
        raise CheckpointError(f"{name} fails its SHA-256 checksum (corrupted)")
    return buf


def refused(name: str, e: Exception) -> CheckpointError:
    """The error for a file whose pickle holds more than tensors and plain containers."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return CheckpointError(
        f"refused to load {name}: it holds pickled objects other than tensors and plain "
        f"containers, and loading them could run code ({first}). Only resume from "
        "checkpoints you trust.")


def load_bytes(buf: bytearray, name: str) -> Any:
    """``torch.load(weights_only=True)`` of verified bytes: pickled objects are refused."""
    import pickle

    try:
        return torch.load(io.BytesIO(buf), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise refused(name, e) from None
