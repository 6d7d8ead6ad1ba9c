"""Checksums at memory speed, and large writes and reads that check them on the way.

One XXH3-128 per 16 MiB chunk of each file. The checksums guard against corruption (bit
flips, truncation, partial or torn writes), not against an adversary: whoever can change a
checkpoint's files can rewrite its manifest too, so a cryptographic hash would buy nothing
(safety against malicious files comes from ``torch.load(weights_only=True)``). XXH3-128
(the ``xxhash`` package, a binding of the reference C library) catches every such error a
128-bit digest can, and runs at ~10 GB/s on one core, releasing the GIL, where SHA-256
manages ~0.5-1.2 GB/s: verification no longer bounds a resume. The manifest names the
algorithm (``"algorithm": "xxh3_128"``) with one digest per fixed-size chunk
(``chunk_bytes``, ``chunks``), all covered by the manifest's own digest. Older manifests
(``sha256_chunks``, or one ``sha256`` per file) still verify.

Writes compute the chunk digests on the way, in a second thread: xxhash and file I/O both
release the GIL on large buffers, so hashing one piece runs while the same piece is written,
and the checksum costs no extra pass over the data. Reads from object storage are checked
before they are interpreted."""

from __future__ import annotations

import hashlib
import io
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import torch

from splitsync.errors import CheckpointError

__all__ = ["CHUNK", "ALGORITHM", "ChunkHasher", "workers", "verify_fd", "verify_buffer", "digest_path", "CHUNK", "HashingWriter", "write_object", "read_verified", "load_bytes", "refused"]

CHUNK = 16 << 20
ALGORITHM = "xxh3_128"
_TITLES = {"xxh3_128": "XXH3-128", "sha256": "SHA-256"}
_FAST = {"xxh3_128"}  # hashes faster than memory copies: no threads needed
_PIECE = 1 << 20  # read size when hashing inline: fits the CPU's cache


class _Hash(Protocol):
    def update(self, data: Any, /) -> None: ...
    def hexdigest(self) -> str: ...


def _factory(algorithm: str) -> Callable[..., _Hash]:
    """The hash object constructor for a manifest's algorithm name."""
    if algorithm == "sha256":
        return hashlib.sha256
    if algorithm == "xxh3_128":
        try:
            import xxhash
        except ImportError:  # a required dependency; say so rather than a bare traceback
            raise CheckpointError("this checkpoint's checksums are XXH3-128, which needs the "
                                  "xxhash package: pip install 'xxhash>=3.0'") from None
        return xxhash.xxh3_128
    raise CheckpointError(f"the manifest's checksum algorithm {algorithm!r} is unknown to this "
                          f"splitsync (it knows {sorted(_TITLES)}); was it written by a newer one?")


def workers() -> int:
    """Threads that hash chunks at once."""
    return max(2, min(8, os.cpu_count() or 1))


class ChunkHasher:
    """The digest (``ALGORITHM``) of every ``CHUNK``-byte piece of a byte stream, fed in order."""

    def __init__(self) -> None:
        self.digests: list[str] = []
        self.size = 0
        self._new = _factory(ALGORITHM)
        self._h = self._new()
        self._n = 0

    def update(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        self.size += len(view)
        while len(view):
            take = min(CHUNK - self._n, len(view))
            self._h.update(view[:take])
            self._n += take
            view = view[take:]
            if self._n == CHUNK:
                self.digests.append(self._h.hexdigest())
                self._h, self._n = self._new(), 0

    def info(self) -> dict[str, Any]:
        """The manifest's entry for the stream: size, algorithm, chunk size, chunk digests."""
        digests = list(self.digests)
        if self._n or not digests:
            digests.append(self._h.hexdigest())
        return _entry(self.size, digests)


def _entry(size: int, digests: list[str]) -> dict[str, Any]:
    return {"size": size, "algorithm": ALGORITHM, "chunk_bytes": CHUNK, "chunks": digests}


def _scheme(label: str, info: dict[str, Any]) -> tuple[str, int, list[str]]:
    """(algorithm, chunk size, expected digests) of a manifest entry, old formats included.
    A whole-file digest is one chunk as large as the file."""
    size = int(info["size"])
    if "chunks" in info:
        algorithm, chunk, digests = str(info.get("algorithm")), int(info["chunk_bytes"]), \
            list(info["chunks"])
    elif "sha256_chunks" in info:  # per-chunk SHA-256 (earlier manifests)
        algorithm, chunk, digests = "sha256", int(info["chunk_bytes"]), list(info["sha256_chunks"])
    elif "sha256" in info:  # one SHA-256 of the whole file (the first manifests)
        return "sha256", max(size, 1), [str(info["sha256"])]
    else:
        raise CheckpointError(f"{label}: the manifest gives no checksum for it (corrupted)")
    _factory(algorithm)  # unknown algorithm: a clear error before any reading
    count = max(1, -(-size // chunk)) if chunk > 0 else -1
    if len(digests) != count:
        raise CheckpointError(f"{label}: the manifest lists {len(digests)} chunk digests for "
                              f"{size} bytes, expected {count} (corrupted)")
    return algorithm, chunk, digests


def _ranges(size: int, chunk: int) -> Iterator[tuple[int, int, int]]:
    for i, start in enumerate(range(0, max(size, 1), chunk)):
        yield i, start, min(chunk, size - start)


def _compare(label: str, algorithm: str, chunk: int, want: list[str], got: list[str],
             first: int = 0, total: int = 0) -> None:
    """``total``: the file's number of chunks (a failure names its chunk if more than one)."""
    for i, (w, g) in enumerate(zip(want, got, strict=True), start=first):
        if w != g:
            where = f" at bytes {i * chunk}.." if max(total, len(want)) > 1 else ""
            raise CheckpointError(f"{label} fails its {_TITLES[algorithm]} checksum{where} "
                                  "(corrupted)")


def _check_size(label: str, actual: int, size: int) -> None:
    if actual != size:
        raise CheckpointError(f"{label} is {actual} bytes, the manifest says {size} "
                              "(truncated or overwritten)")


def verify_fd(fd: int, label: str, info: dict[str, Any],
              share: tuple[int, int] = (0, 1)) -> None:
    """Check the open file ``fd`` against ``info``; raises CheckpointError.

    ``share=(i, n)``: check the size, and only the ``i``-th of ``n`` contiguous runs of its
    chunks: ``n`` ranks that read one file each hash their own part, and together all of it
    (a whole-file digest is checked by share 0)."""
    index, count = share
    if not 0 <= index < count:
        raise ValueError(f"share={share!r}: give (i, n) with 0 <= i < n")
    size = int(info["size"])
    _check_size(label, os.fstat(fd).st_size, size)
    algorithm, chunk, want = _scheme(label, info)
    if len(want) == 1 and size > CHUNK:  # whole-file digest: one stream, read in pieces
        if index:
            return
        h = _factory(algorithm)()
        for _, start, n in _ranges(size, CHUNK):
            h.update(os.pread(fd, n, start))
        got = [h.hexdigest()]
        _compare(label, algorithm, chunk, want, got)
        return
    first, last = index * len(want) // count, (index + 1) * len(want) // count
    got = _hash_chunks(fd, size, chunk, label, algorithm, first, last)
    _compare(label, algorithm, chunk, want[first:last], got, first, len(want))


def _hash_chunks(fd: int, size: int, chunk: int, label: str, algorithm: str,
                 first: int = 0, last: int | None = None) -> list[str]:
    """The digest of every chunk of ``fd`` (or of chunks ``first`` to ``last - 1``), read in
    order (the disk sees one sequential stream; concurrent reads at scattered offsets defeat
    readahead)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass
    os.lseek(fd, first * chunk, os.SEEK_SET)
    ranges = list(_ranges(size, chunk))[first:last]
    if algorithm in _FAST:
        return _hash_inline(fd, ranges, chunk, label, _factory(algorithm))
    return _hash_pooled(fd, ranges, chunk, label, _factory(algorithm))


def _read_into(fd: int, view: memoryview, label: str) -> None:
    got = 0
    while got < len(view):
        k = os.readv(fd, [view[got:]])
        if k == 0:
            raise CheckpointError(f"{label} ended early (truncated while being read)")
        got += k


def _hash_inline(fd: int, ranges: list[tuple[int, int, int]], chunk: int, label: str,
                 new: Callable[..., _Hash]) -> list[str]:
    """Read in ``_PIECE``-byte pieces into one buffer that stays in the CPU's cache and hash
    each piece right away: the hash reads what the copy out of the page cache just wrote,
    so verifying costs no extra trip to memory (measured: as fast as reading alone)."""
    buf = memoryview(bytearray(min(_PIECE, max(chunk, 1))))
    digests: list[str] = []
    for _, start, n in ranges:
        h = new()
        for off in range(start, start + n, len(buf)):
            piece = buf[:min(len(buf), start + n - off)]
            _read_into(fd, piece, label)
            h.update(piece)
        digests.append(h.hexdigest())
    return digests


def _hash_pooled(fd: int, ranges: list[tuple[int, int, int]], chunk: int, label: str,
                 new: Callable[..., _Hash]) -> list[str]:
    """Chunks read in order by this thread and hashed by a pool of threads, through a ring
    of reused buffers: for SHA-256 (older manifests), slower than a fast disk on one core."""
    ring = [memoryview(bytearray(chunk)) for _ in range(min(max(len(ranges), 1),
                                                             workers() + 2))]
    pending: deque[Future[str]] = deque()
    digests: list[str] = []
    with ThreadPoolExecutor(workers(), thread_name_prefix="ckpt-verify") as pool:
        for i, (_, _, n) in enumerate(ranges):
            if len(pending) == len(ring):  # the oldest hash frees the buffer reused now
                digests.append(pending.popleft().result())
            buf = ring[i % len(ring)][:n]
            _read_into(fd, buf, label)
            pending.append(pool.submit(_hex, new, buf))
        digests.extend(f.result() for f in pending)
    return digests


def _hex(new: Callable[..., _Hash], view: memoryview) -> str:
    h = new()
    h.update(view)
    return h.hexdigest()


def verify_buffer(buf: Any, label: str, info: dict[str, Any]) -> None:
    """Check bytes already in memory against ``info`` (chunks hashed in parallel)."""
    view = memoryview(buf).cast("B")
    size = int(info["size"])
    _check_size(label, len(view), size)
    algorithm, chunk, want = _scheme(label, info)
    new = _factory(algorithm)
    with ThreadPoolExecutor(workers(), thread_name_prefix="ckpt-verify") as pool:
        got = list(pool.map(lambda r: _hex(new, view[r[1]:r[1] + r[2]]), _ranges(size, chunk)))
    _compare(label, algorithm, chunk, want, got)


def digest_path(path: Path) -> dict[str, Any]:
    """The manifest entry of a file another library wrote (DCP's)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        digests = _hash_chunks(fd, size, CHUNK, str(path), ALGORITHM)
    finally:
        os.close(fd)
    return _entry(size, digests)


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
