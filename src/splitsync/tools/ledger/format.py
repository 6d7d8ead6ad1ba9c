"""The ledger's file format: checksummed records, sample ids in the smallest fitting encoding.

A ledger file (``ledger/launch-NNNNN/rank-NNNNN.ledger``) is a magic line, then records::

    kind (1 byte) | payload length (u32) | crc32 of kind and payload (u32) | payload

Kinds: ``M`` the launch (JSON), ``P`` a loader pass begins (JSON), ``R`` ``run.resume``
(JSON), ``S`` the samples of one optimizer step from one loader and epoch (binary), ``C``
``run.close`` (JSON). Each write is one ``os.write`` of whole records, so a killed process
leaves whole records behind; a record cut short or altered fails its length or checksum and
the file is reported unreadable from that byte on.

A step record's ids are stored as u16, u32 or i64 values, whichever is the smallest that
fits, or as runs (first id i64, length u32) when consecutive ids make that smaller: shuffled
indices take 2 or 4 bytes a sample, a stream's consecutive positions a few bytes a batch.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LEDGER_DIR", "MAGIC", "width_for", "Step", "ParsedFile", "record", "json_record", "step_record", "parse",
           "read_file", "rank_file", "launch_dir"]

LEDGER_DIR = "ledger"  # under run_dir
MAGIC = b"SPLITSYNC-LEDGER 1\n"
_HEAD = struct.Struct("<cII")  # kind, payload length, crc32
_STEP = struct.Struct("<IHIHBI")  # step, loader, epoch, padded, encoding, count: 17 bytes
_U16, _U32, _I64, _RUNS = 0, 1, 2, 3
_RUN = np.dtype([("first", "<i8"), ("length", "<u4")])
_RUN_PACK = struct.Struct("<qI")


def launch_dir(root: Path, launch: int) -> Path:
    return root / f"launch-{launch:05d}"


def rank_file(root: Path, launch: int, rank: int) -> Path:
    return launch_dir(root, launch) / f"rank-{rank:05d}.ledger"


@dataclass(frozen=True)
class Step:
    """One step record: ``ids`` (int64) of ``loader``'s samples in ``epoch`` that ``step``
    trained, the last ``padded`` of them padding repeats (DistributedSampler's)."""

    step: int
    loader: int
    epoch: int
    padded: int
    ids: np.ndarray


@dataclass
class ParsedFile:
    """What a ledger file holds, in order, and where it stopped being readable."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    records: list[tuple[str, Any]] = field(default_factory=list)  # ("P"/"R"/"C", dict) or ("S", Step)
    size: int = 0
    error: str | None = None  # why (and at which byte) the file is unreadable


def record(kind: bytes, payload: bytes) -> bytes:
    return _HEAD.pack(kind, len(payload), zlib.crc32(payload, zlib.crc32(kind))) + payload


def json_record(kind: bytes, obj: dict[str, Any]) -> bytes:
    return record(kind, json.dumps(obj, sort_keys=True).encode())


def width_for(n: int) -> int:
    """Bytes per id for ids below ``n``."""
    return 2 if n <= 1 << 16 else 4 if n <= 1 << 32 else 8


_CODES = {2: (_U16, "H"), 4: (_U32, "I"), 8: (_I64, "q")}


def step_record(step: int, loader: int, epoch: int, padded: int,
                ids: Sequence[int] | np.ndarray, width: int | None = None) -> bytes:
    """An ``S`` record of non-negative ``ids``. ``width``: store them as values of that many
    bytes without looking for runs (an indexable dataset's ids, whose bound is known);
    None: the smaller of values and runs. Plain Python on lists: a batch's worth is cheaper
    than numpy's per-call overhead."""
    if isinstance(ids, np.ndarray):
        ids = ids.tolist()
    n = len(ids)
    enc = -1
    if width is None:
        width = width_for(max(ids) + 1 if n else 0)
        starts = [0] + [i for i in range(1, n) if ids[i] != ids[i - 1] + 1] if n else []
        if len(starts) * _RUN.itemsize < n * width:
            ends = [*starts[1:], n]
            body = b"".join(_RUN_PACK.pack(ids[a], b - a)
                            for a, b in zip(starts, ends, strict=True))
            enc = _RUNS
    if enc < 0:
        enc, code = _CODES[width]
        try:
            arr = array(code, ids)
        except OverflowError:  # an id beyond the bound given: look at the ids themselves
            return step_record(step, loader, epoch, padded, ids)
        if sys.byteorder != "little":
            arr.byteswap()
        body = arr.tobytes()
    return record(b"S", _STEP.pack(step, loader, epoch, padded, enc, n) + body)


def _decode_step(payload: bytes) -> Step:
    step, loader, epoch, padded, enc, n = _STEP.unpack_from(payload)
    body = payload[_STEP.size:]
    if enc == _RUNS:
        arr = np.frombuffer(body, dtype=_RUN)
        lengths = arr["length"].astype(np.int64)
        if int(lengths.sum()) != n:
            raise ValueError("a step record's runs do not add up to its sample count")
        ids = (np.repeat(arr["first"] - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
               + np.arange(n, dtype=np.int64)) if n else np.empty(0, np.int64)
    else:
        dtype = {_U16: "<u2", _U32: "<u4", _I64: "<i8"}[enc]
        if len(body) != n * np.dtype(dtype).itemsize:
            raise ValueError("a step record's size does not match its sample count")
        ids = np.frombuffer(body, dtype=dtype).astype(np.int64)
    return Step(step, loader, epoch, padded, ids)


def parse(data: bytes, path: Path) -> ParsedFile:
    """Every whole, intact record of ``data``; ``error`` says where and why reading stopped."""
    out = ParsedFile(path, size=len(data))
    if not data.startswith(MAGIC):
        out.error = ("not a splitsync ledger (bad magic line)" if len(data) >= len(MAGIC)
                     else f"truncated: {len(data)} byte(s), shorter than the magic line")
        return out
    pos = len(MAGIC)
    while pos < len(data):
        if pos + _HEAD.size > len(data):
            out.error = f"truncated at byte {pos}: a record header is cut short"
            return out
        kind, length, crc = _HEAD.unpack_from(data, pos)
        payload = data[pos + _HEAD.size: pos + _HEAD.size + length]
        if len(payload) < length:
            out.error = (f"truncated at byte {pos}: a record of {length} byte(s) has only "
                         f"{len(payload)}")
            return out
        if zlib.crc32(payload, zlib.crc32(kind)) != crc:
            out.error = f"corrupt at byte {pos}: a record fails its checksum"
            return out
        try:
            k = kind.decode()
            if k == "S":
                out.records.append(("S", _decode_step(payload)))
            elif k == "M":
                out.meta = json.loads(payload)
            elif k in "PRC":
                out.records.append((k, json.loads(payload)))
            else:
                raise ValueError(f"unknown record kind {k!r}")
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            out.error = f"unreadable record at byte {pos}: {exc}"
            return out
        pos += _HEAD.size + length
    if not out.meta:
        out.error = "no launch record (the file ends before its first record)"
    return out


def read_file(path: Path) -> ParsedFile:
    return parse(path.read_bytes(), path)
