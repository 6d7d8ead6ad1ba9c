"""Large sequential writes that compute the chunk digests on the way, in a second thread,
and reads from object storage checked before they are interpreted.

xxhash and file I/O both release the GIL on large buffers, so hashing one piece runs while
the same piece is written: the checksum costs no extra pass over the data and almost no
extra time (one XXH3 stream runs at memory speed, far above the disk's write speed).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import torch

from splitsync.ckpt.digest import CHUNK, ChunkHasher, verify_buffer
from splitsync.ckpt.store import CheckpointError

__all__ = ["CHUNK", "HashingWriter", "write_object", "read_verified", "load_bytes", "refused"]

_INLINE = 1 << 20  # smaller pieces are hashed inline: a thread hop would cost more


class HashingWriter(io.RawIOBase):
    """A write-only file object that hashes and counts what passes through to ``raw``."""

    def __init__(self, raw: BinaryIO, pool: ThreadPoolExecutor) -> None:
        super().__init__()
        self.raw = raw
        self.pool = pool
        self.hash = ChunkHasher()
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
    """``torch.save(obj)`` into a new file; returns its size and chunk digests (made while
    writing)."""
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-hash") as pool, create() as raw:
        w = HashingWriter(raw, pool)
        torch.save(obj, w)
        durable(raw)
    return w.hash.info()


def read_verified(f: BinaryIO, name: str, info: dict[str, Any]) -> bytearray:
    """All of ``f`` in large reads, then checked against ``info`` (the manifest's size and
    chunk digests, hashed in parallel) before anything may interpret the bytes."""
    size = int(info["size"])
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = f.readinto(view[got:got + CHUNK]) if hasattr(f, "readinto") else None
        if n is None:  # some fsspec files only offer read()
            chunk = f.read(min(CHUNK, size - got))
            n = len(chunk)
            view[got:got + n] = chunk
        if not n:
            break
        got += n
    if got != size or f.read(1):
        raise CheckpointError(f"{name} is not {size} bytes as the manifest says "
                              "(truncated or overwritten)")
    verify_buffer(buf, name, info)
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
