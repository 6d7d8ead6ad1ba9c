"""The ledger's file format: checksummed records, sample ids in the smallest fitting encoding.

A ledger file (``ledger/launch-NNNNN/rank-NNNNN.ledger``) is a magic line, then records::

    kind (1 byte) | payload length (u32) | crc32 of kind and payload (u32) | payload

Kinds: ``M`` the launch (JSON), ``P`` a loader pass begins (JSON), ``R`` ``run.resume``
(JSON), ``S`` the samples of one or more optimizer steps from one loader (binary), ``C``
``run.close`` (JSON); fault-tolerant runs add ``F`` (a step's group-batch, JSON) and ``L``
(the lineage of committed steps, JSON), see :mod:`splitsync.tools.audit.ledger.ft`. Each write is one ``os.write`` of whole records, so a killed process
leaves whole records behind; a record cut short or altered fails its length or checksum and
the file is reported unreadable from that byte on. A write holds the passes begun since the
previous one, then the steps taken since (an ``S`` record per loader), then the ``R`` or
``C`` record that called for it, if any: ``P`` and ``S`` records carry the step they belong
to, so the audit needs no order between them.

An ``S`` record holds a table of its steps, one row of four u32 per step and epoch (step,
epoch, sample count, padded count), then all their sample ids back to back, as u16, u32 or i64
values, whichever is the smallest that fits, or as runs (first id i64, length u32) when
consecutive ids make that smaller: shuffled indices take 2 or 4 bytes a sample, a stream's
consecutive positions a few bytes a batch. The recorder writes one such record per loader
for all the steps it buffered, encoded in one go (numpy), so a step costs no encoding.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LEDGER_DIR", "MAGIC", "ROW", "Step", "ParsedFile", "record", "json_record",
           "steps_record", "step_record", "parse", "read_file", "rank_file", "launch_dir"]

LEDGER_DIR = "ledger"  # under run_dir
MAGIC = b"SPLITSYNC-LEDGER 2\n"
_OLD_MAGIC = b"SPLITSYNC-LEDGER 1\n"
_HEAD = struct.Struct("<cII")  # kind, payload length, crc32
_STEPS = struct.Struct("<HBII")  # loader, encoding, rows, ids: 11 bytes
ROW = np.dtype([("step", "<u4"), ("epoch", "<u4"), ("count", "<u4"), ("padded", "<u4")])
_COLUMNS = np.dtype("<u4")  # a row as it is built: the same 16 bytes
_U16, _U32, _I64, _RUNS = 0, 1, 2, 3
_VALUES = {_U16: np.dtype("<u2"), _U32: np.dtype("<u4"), _I64: np.dtype("<i8")}
_RUN = np.dtype([("first", "<i8"), ("length", "<u4")])


def launch_dir(root: Path, launch: int) -> Path:
    return root / f"launch-{launch:05d}"


def rank_file(root: Path, launch: int, rank: int) -> Path:
    return launch_dir(root, launch) / f"rank-{rank:05d}.ledger"


@dataclass(frozen=True)
class Step:
    """One step's samples: ``ids`` (int64) of ``loader``'s samples in ``epoch`` that ``step``
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


def _encode(ids: np.ndarray) -> tuple[int, bytes]:
    """(encoding, body) of non-negative int64 ``ids``: the smaller of values and runs."""
    n = len(ids)
    if n == 0:
        return _U16, b""
    if int(ids.min()) < 0:
        raise ValueError(f"a sample id is negative ({int(ids.min())}); ids are indices or "
                         "stream positions")
    top = int(ids.max())
    enc = _U16 if top < 1 << 16 else _U32 if top < 1 << 32 else _I64
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1  # where a run of consecutive ids ends
    if (len(breaks) + 1) * _RUN.itemsize < n * _VALUES[enc].itemsize:
        starts = np.r_[0, breaks]
        runs = np.empty(len(starts), _RUN)
        runs["first"] = ids[starts]
        runs["length"] = np.diff(np.r_[starts, n])
        return _RUNS, runs.tobytes()
    return enc, ids.astype(_VALUES[enc]).tobytes()


def steps_record(loader: int, rows: np.ndarray | Sequence[tuple[int, int, int, int]],
                 ids: np.ndarray) -> bytes:
    """An ``S`` record of ``loader``'s steps: ``rows`` of (step, epoch, count, padded) in
    order, ``ids`` the samples of every row back to back (``count`` each)."""
    table = np.array(rows, dtype=_COLUMNS).reshape(-1, 4)  # faster than a structured build
    ids = np.asarray(ids, dtype=np.int64)
    counted = int(table[:, 2].sum(dtype=np.int64))
    if counted != len(ids):
        raise ValueError(f"the rows count {counted} sample(s) but {len(ids)} id(s) were given")
    enc, body = _encode(ids)
    head = _STEPS.pack(loader, enc, len(table), len(ids))
    return record(b"S", head + table.tobytes() + body)


def step_record(step: int, loader: int, epoch: int, padded: int,
                ids: Sequence[int] | np.ndarray) -> bytes:
    """An ``S`` record of one step (a convenience for tools and tests)."""
    return steps_record(loader, [(step, epoch, len(ids), padded)], np.asarray(ids, np.int64))


def _decode_steps(payload: bytes) -> list[Step]:
    loader, enc, rows, n = _STEPS.unpack_from(payload)
    at = _STEPS.size + rows * ROW.itemsize
    if len(payload) < at:
        raise ValueError("a steps record is shorter than its table")
    table = np.frombuffer(payload, ROW, rows, _STEPS.size)
    counts = table["count"].astype(np.int64)
    if int(counts.sum()) != n:
        raise ValueError("a steps record's rows do not add up to its sample count")
    body = payload[at:]
    if enc == _RUNS:
        if len(body) % _RUN.itemsize:
            raise ValueError("a steps record's runs are cut")
        runs = np.frombuffer(body, dtype=_RUN)
        lengths = runs["length"].astype(np.int64)
        if int(lengths.sum()) != n:
            raise ValueError("a steps record's runs do not add up to its sample count")
        ids = (np.repeat(runs["first"] - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
               + np.arange(n, dtype=np.int64))
    elif enc in _VALUES:
        if len(body) != n * _VALUES[enc].itemsize:
            raise ValueError("a steps record's size does not match its sample count")
        ids = np.frombuffer(body, dtype=_VALUES[enc]).astype(np.int64)
    else:
        raise ValueError(f"unknown id encoding {enc}")
    parts = np.split(ids, np.cumsum(counts)[:-1]) if rows else []
    return [Step(int(r["step"]), loader, int(r["epoch"]), int(r["padded"]), part)
            for r, part in zip(table, parts, strict=True)]


def parse(data: bytes, path: Path) -> ParsedFile:
    """Every whole, intact record of ``data``; ``error`` says where and why reading stopped."""
    out = ParsedFile(path, size=len(data))
    if not data.startswith(MAGIC):
        out.error = ("ledger format 1, written by an older splitsync: audit it with that "
                     "version" if data.startswith(_OLD_MAGIC)
                     else "not a splitsync ledger (bad magic line)" if len(data) >= len(MAGIC)
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
                out.records.extend(("S", step) for step in _decode_steps(payload))
            elif k == "M":
                out.meta = json.loads(payload)
            elif k in "PRCFL":
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
