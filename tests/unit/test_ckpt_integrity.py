"""Checkpoint checksums: XXH3-128 per chunk, named in the manifest; SHA-256 manifests still load."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt import CheckpointWarning
from splitsync.ckpt import integrity as digest
from splitsync.ckpt.store import MANIFEST, manifest_text, read_manifest
from splitsync.errors import CheckpointError

xxhash = pytest.importorskip("xxhash")

SMALL = 4096  # chunk size for these tests: many chunks from a small model


def _run_and_save(root: Path, steps: int = 2) -> list[torch.Tensor]:
    """Train ``steps`` steps, saving after each; the parameters at the last save."""
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(64, 48))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run.resume(root, model=model, optimizer=opt)
        for _ in range(steps):
            run.backward(model(torch.randn(2, 64)).sum())
            run.step(opt)
            run.save(root)
        return [p.detach().clone() for p in model.parameters()]


def _resume(root: Path) -> tuple[int, list[torch.Tensor]]:
    with ss.init(seed=0) as run:
        torch.manual_seed(1)
        model = run.model(nn.Linear(64, 48))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        state = run.resume(root, model=model, optimizer=opt)
        return state.step, [p.detach().clone() for p in model.parameters()]


def _chunks(data: bytes, chunk: int, fn) -> list[str]:
    return [fn(data[i:i + chunk]).hexdigest() for i in range(0, max(len(data), 1), chunk)]


def _rewrite(ckpt: Path, entry) -> None:
    """Replace every file's manifest entry by ``entry(bytes)`` (the manifest stays valid)."""
    body = read_manifest(ckpt)
    files = {rel: entry((ckpt / rel).read_bytes()) for rel in body.pop("files")}
    body.pop("format")
    (ckpt / MANIFEST).write_text(manifest_text(body, files))


def _flip(f: Path, at: int) -> None:
    data = bytearray(f.read_bytes())
    data[at] ^= 0x04
    f.write_bytes(bytes(data))


def test_manifest_names_xxh3_and_digests_every_chunk(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(digest, "CHUNK", SMALL)
    _run_and_save(tmp_path, steps=1)
    ckpt = tmp_path / "step-000001"
    files = read_manifest(ckpt)["files"]
    data = (ckpt / "state.pt").read_bytes()
    entry = files["state.pt"]
    assert entry["algorithm"] == "xxh3_128" and entry["chunk_bytes"] == SMALL
    assert len(entry["chunks"]) > 3  # several chunks, each checked on its own
    assert entry["chunks"] == _chunks(data, SMALL, xxhash.xxh3_128)
    assert all("sha256" not in e and "sha256_chunks" not in e for e in files.values())


def test_flipped_bit_in_a_later_chunk_is_caught(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(digest, "CHUNK", SMALL)
    saved = _run_and_save(tmp_path)
    state = tmp_path / "step-000002" / "state.pt"
    at = 2 * SMALL + 123
    assert state.stat().st_size > at
    _flip(state, at)
    with pytest.warns(CheckpointWarning,
                      match=f"step-000002.*XXH3-128 checksum at bytes {2 * SMALL}"):
        step, params = _resume(tmp_path)
    assert step == 1
    assert not all(torch.equal(a, b) for a, b in zip(params, saved, strict=True))


@pytest.mark.parametrize("old", ["sha256_chunks", "sha256"])
def test_sha256_manifests_still_load_and_verify(tmp_path: Path, old: str) -> None:
    saved = _run_and_save(tmp_path)
    for ckpt in ("step-000001", "step-000002"):
        if old == "sha256":  # the first format: one SHA-256 of the whole file
            _rewrite(tmp_path / ckpt, lambda d: {"size": len(d),
                                                 "sha256": hashlib.sha256(d).hexdigest()})
        else:  # one SHA-256 per chunk
            _rewrite(tmp_path / ckpt, lambda d: {
                "size": len(d), "chunk_bytes": 256,
                "sha256_chunks": _chunks(d, 256, hashlib.sha256)})
    step, params = _resume(tmp_path)
    assert step == 2
    for a, b in zip(params, saved, strict=True):
        assert torch.equal(a, b)
    # ... and still verify: a flipped bit in the newest is caught, the older one is used
    _flip(tmp_path / "step-000002" / "state.pt", 300)
    with pytest.warns(CheckpointWarning, match="step-000002.*SHA-256 checksum"):
        step, _ = _resume(tmp_path)
    assert step == 1


def test_verify_buffer_and_fd_agree(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(digest, "CHUNK", SMALL)
    data = bytes(range(256)) * 100  # 6.25 chunks
    h = digest.ChunkHasher()
    h.update(data[:1000])
    h.update(data[1000:])
    info = h.info()
    assert info["chunks"] == _chunks(data, SMALL, xxhash.xxh3_128)
    digest.verify_buffer(data, "x", info)
    f = tmp_path / "x"
    f.write_bytes(data)
    fd = os.open(f, os.O_RDONLY)
    try:
        digest.verify_fd(fd, "x", info)
    finally:
        os.close(fd)
    bad = bytearray(data)
    bad[-1] ^= 1
    with pytest.raises(CheckpointError, match=r"x fails its XXH3-128 checksum at bytes 24576"):
        digest.verify_buffer(bad, "x", info)
    with pytest.raises(CheckpointError, match="truncated"):
        digest.verify_buffer(data[:-1], "x", info)
    assert digest.ChunkHasher().info()["chunks"] == [xxhash.xxh3_128(b"").hexdigest()]


def test_unknown_algorithm_or_wrong_chunk_count_is_a_clear_error() -> None:
    data = b"abc" * 10
    info = {"size": len(data), "algorithm": "crc7", "chunk_bytes": 16, "chunks": ["0", "1"]}
    with pytest.raises(CheckpointError, match="algorithm 'crc7' is unknown"):
        digest.verify_buffer(data, "f", info)
    info = {**info, "algorithm": "xxh3_128", "chunks": ["0"]}
    with pytest.raises(CheckpointError, match="lists 1 chunk digests for 30 bytes, expected 2"):
        digest.verify_buffer(data, "f", info)
    with pytest.raises(CheckpointError, match="no checksum"):
        digest.verify_buffer(data, "f", {"size": len(data)})


def test_shares_check_their_own_run_of_chunks_and_together_all(tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(digest, "CHUNK", SMALL)
    data = bytes(range(256)) * 112  # 7 chunks
    h = digest.ChunkHasher()
    h.update(data)
    info = h.info()
    f = tmp_path / "x"

    def failing(n: int) -> list[int]:
        fd = os.open(f, os.O_RDONLY)
        try:
            out = []
            for i in range(n):
                try:
                    digest.verify_fd(fd, "x", info, (i, n))
                except CheckpointError:
                    out.append(i)
            return out
        finally:
            os.close(fd)

    for chunk in range(7):
        bad = bytearray(data)
        bad[chunk * SMALL + 5] ^= 1
        f.write_bytes(bytes(bad))
        assert failing(1) == [0]
        for n in (2, 3, 7, 9):  # exactly one share holds the chunk, also with more shares
            assert failing(n) == [i for i in range(n) if i * 7 // n <= chunk < (i + 1) * 7 // n]
            assert len(failing(n)) == 1
    f.write_bytes(data[:-1])  # every share checks the size
    fd = os.open(f, os.O_RDONLY)
    try:
        for i in range(3):
            with pytest.raises(CheckpointError, match="truncated"):
                digest.verify_fd(fd, "x", info, (i, 3))
        with pytest.raises(ValueError, match="share"):
            digest.verify_fd(fd, "x", info, (3, 3))
    finally:
        os.close(fd)


def test_a_share_of_one_chunk_names_the_bytes_that_fail(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(digest, "CHUNK", SMALL)
    data = bytes(range(256)) * 32  # 2 chunks: each of 2 shares holds one
    h = digest.ChunkHasher()
    h.update(data)
    info = h.info()
    bad = bytearray(data)
    bad[5] ^= 1
    f = tmp_path / "x"
    f.write_bytes(bytes(bad))
    fd = os.open(f, os.O_RDONLY)
    try:  # the first chunk of a file of two: its offset is named, as for the last one
        with pytest.raises(CheckpointError, match=r"checksum at bytes 0\.\."):
            digest.verify_fd(fd, "x", info, (0, 2))
        digest.verify_fd(fd, "x", info, (1, 2))
    finally:
        os.close(fd)
    f.write_bytes(data[:SMALL])  # one chunk of one: nothing to name
    one = digest.ChunkHasher()
    one.update(data[:SMALL])
    bad_one = {**one.info(), "chunks": ["0" * 32]}
    fd = os.open(f, os.O_RDONLY)
    try:
        with pytest.raises(CheckpointError, match=r"checksum \(corrupted\)"):
            digest.verify_fd(fd, "x", bad_one)
    finally:
        os.close(fd)
