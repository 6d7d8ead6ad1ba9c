"""Two ranks verify the state file they both read in shares, each its own run of chunks; a
bad chunk in either share makes both ranks skip that checkpoint, and neither loads it."""

from __future__ import annotations

import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt import integrity as digest
from splitsync.testing import spawn

SMALL = 4096  # many chunks from a small model


def _train(root: str, steps: int) -> list[list[Any]]:
    """Params after each step (each step saved)."""
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(64, 48))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run.resume(root, model=model, optimizer=opt)
        saved = []
        for _ in range(steps):
            run.backward(model(torch.randn(2, 64)).sum())
            run.step(opt)
            run.save(root)
            saved.append([p.detach().numpy().copy() for p in model.parameters()])
        return saved


def _tensor_bytes(path: Path) -> list[int]:
    """The middle byte of every tensor's record in a torch.save file."""
    with zipfile.ZipFile(path) as zf:
        infos = [i for i in zf.infolist() if re.search(r"/data/\d+$", i.filename)]
        with open(path, "rb") as f:
            out = []
            for i in infos:  # the data starts after the local header (name and padding)
                f.seek(i.header_offset + 26)
                n, extra = struct.unpack("<HH", f.read(4))
                out.append(i.header_offset + 30 + n + extra + i.file_size // 2)
    return out


def ranks(rank: int, world: int, root: str) -> dict[str, Any]:
    digest.CHUNK = SMALL  # this rank's own module: the saves write many small chunks
    holder = ss.init(seed=0)
    try:
        saved = _train(root, 2)
        out: dict[str, Any] = {"saved": saved, "resumed": [], "params": []}
        state = Path(root) / "step-000002" / "state.pt"
        size = state.stat().st_size
        # in rank 0's share (the pickle), in rank 1's (the zip's directory), then in every
        # tensor: nothing of step 2 may reach the model
        cases = [[5], [size - 5], _tensor_bytes(state)]
        for at in cases:
            holder.barrier()
            if rank == 0:
                data = bytearray(state.read_bytes())
                for i in at:
                    data[i] ^= 0x04
                state.write_bytes(bytes(data))
            holder.barrier()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with ss.init(seed=0) as run:
                    torch.manual_seed(1)
                    model = run.model(nn.Linear(64, 48))
                    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                    got = run.resume(root, model=model, optimizer=opt)
                    out["params"].append([p.detach().numpy().copy()
                                          for p in model.parameters()])
            out["resumed"].append((got.step, [str(w.message) for w in caught]))
            holder.barrier()
            if rank == 0:  # put step 2 back (set aside as damaged) for the next case
                aside = next(Path(root).glob(".skipped-step-000002*"), None) or next(
                    p for p in Path(root).iterdir() if "skipped" in p.name)
                aside.rename(Path(root) / "step-000002")
                data = bytearray(state.read_bytes())
                for i in at:
                    data[i] ^= 0x04
                state.write_bytes(bytes(data))
            holder.barrier()
        with ss.init(seed=0) as run:  # step 2, whole again
            torch.manual_seed(1)
            model = run.model(nn.Linear(64, 48))
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            out["healthy"] = run.resume(root, model=model, optimizer=opt).step
            out["final"] = [p.detach().numpy().copy() for p in model.parameters()]
        out["size"] = size
        return out
    finally:
        holder.close()


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_bad_chunk_in_either_ranks_share_skips_the_checkpoint_on_both(tmp_path: Path) -> None:
    res = spawn(ranks, 2, str(tmp_path / "ck"), timeout=120)
    assert res[0]["size"] > 4 * SMALL  # several chunks, so each rank has a share
    for rank, r in enumerate(res):
        for step, _ in r["resumed"]:
            assert step == 1, (rank, r["resumed"])  # step 2 skipped by both ranks
        for params in r["params"]:  # exactly step 1's
            assert all(np.array_equal(a, b) for a, b in zip(params, r["saved"][0], strict=True))
        assert r["healthy"] == 2
        assert all(np.array_equal(a, b) for a, b in zip(r["final"], r["saved"][1], strict=True))
        if rank == 0:  # rank 0 warns, naming the chunk that failed, whichever rank hashed it
            first, last, _ = (m for _, m in r["resumed"])
            assert any("checksum at bytes 0.." in m for m in first), first
            assert any(f"checksum at bytes {(r['size'] - 5) // SMALL * SMALL}.." in m
                       for m in last), last
