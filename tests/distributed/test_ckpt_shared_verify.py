"""Two ranks verify the state file they both read in shares, each its own run of chunks; a
bad chunk in either share makes both ranks skip that checkpoint, and neither loads it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt import digest
from splitsync.testing import spawn

SMALL = 4096  # many chunks from a small model


def _train(root: str, steps: int) -> list[Any]:
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(64, 48))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        run.resume(root, model=model, optimizer=opt)
        for _ in range(steps):
            run.backward(model(torch.randn(2, 64)).sum())
            run.step(opt)
            run.save(root)
        return [p.detach().numpy().copy() for p in model.parameters()]


def ranks(rank: int, world: int, root: str) -> dict[str, Any]:
    digest.CHUNK = SMALL  # this rank's own module: the saves write many small chunks
    holder = ss.init(seed=0)
    try:
        saved = _train(root, 2)
        out: dict[str, Any] = {"saved": saved, "resumed": []}
        state = Path(root) / "step-000002" / "state.pt"
        size = state.stat().st_size
        for at in (5, size - 5):  # in rank 0's share, then in rank 1's
            holder.barrier()
            if rank == 0:
                data = bytearray(state.read_bytes())
                data[at] ^= 0x04
                state.write_bytes(bytes(data))
            holder.barrier()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with ss.init(seed=0) as run:
                    torch.manual_seed(1)
                    model = run.model(nn.Linear(64, 48))
                    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                    got = run.resume(root, model=model, optimizer=opt)
            out["resumed"].append((got.step, [str(w.message) for w in caught]))
            holder.barrier()
            if rank == 0:  # put step 2 back (set aside as damaged) for the next case
                aside = next(Path(root).glob(".skipped-step-000002*"), None) or next(
                    p for p in Path(root).iterdir() if "skipped" in p.name)
                aside.rename(Path(root) / "step-000002")
                data = bytearray(state.read_bytes())
                data[at] ^= 0x04
                state.write_bytes(bytes(data))
            holder.barrier()
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
        if rank == 0:  # rank 0 warns, naming the chunk that failed, whichever rank hashed it
            first, last = (m for _, m in r["resumed"])
            assert any("checksum at bytes 0.." in m for m in first), first
            assert any(f"checksum at bytes {(r['size'] - 5) // SMALL * SMALL}.." in m
                       for m in last), last
