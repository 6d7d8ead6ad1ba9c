"""Streams resumed from a checkpoint: bit-exact at the same size, exactly-once at another."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from streamkit import make
from torch import nn

import splitsync as ss
from splitsync.testing import spawn

pytest.importorskip("datasets")
pytestmark = pytest.mark.slow
ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
KINDS = ("torch", "hf")


def phase(rank: int, world: int, root: str, stop_after: int | None, kinds: tuple[str, ...],
          workers: int = 0, sizes: tuple[int, ...] = (10, 10, 10, 10), batch: int = 4
          ) -> dict[str, tuple[int, list[list[int]], str]]:
    """Train epoch 0 of ``kinds``; with ``stop_after``, save after that many steps and stop.

    Pass one kind per spawned process: forming a second gloo group in a process that had
    one can hang in torch's rendezvous, whatever the loader.
    """
    out = {}
    for kind in kinds:
        with ss.init(seed=3) as run:
            model = run.model(nn.Linear(2, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            data, collate = make(kind, f"{root}/data-{kind}/r{rank}", list(sizes))
            loader = run.loader(data, batch_size=batch, shuffle=True, buffer_size=3,
                                num_workers=workers, collate_fn=collate)
            state = run.resume(f"{root}/ck-{kind}", model=model, optimizer=opt)
            seen: list[list[int]] = []
            step = state.step
            for _ in run.epochs(1, start=state.epoch):
                for x in loader:
                    run.backward(model(x).sum())
                    run.step(opt)
                    step += 1
                    seen.append([int(i) for i in x[:, 0].tolist()])
                    if step == stop_after:
                        run.save()
                        break
            out[kind] = (state.epoch, seen, loader.readers.layout.mode)
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_resume_at_three_then_one_rank_trains_the_rest_exactly_once(tmp_path: Path,
                                                                    kind: str) -> None:
    root, kinds = str(tmp_path), (kind,)  # one process group per process: one kind per spawn
    first = spawn(phase, 2, root, 2, kinds, timeout=120, env=ENV)
    before = [i for r in first for b in r[kind][1] for i in b]
    assert len(before) == 2 * 2 * 4
    for world in (3, 1):
        second = spawn(phase, world, root, None, kinds, timeout=120, env=ENV) if world > 1 else [
            phase(0, 1, root, None, kinds)]
        after = [i for r in second for b in r[kind][1] for i in b]
        counts = Counter(before + after)
        assert sorted(counts) == list(range(40)), f"{kind} at {world}: samples lost"
        assert max(counts.values()) == 1, f"{kind} at {world}: samples trained twice"
        mode = second[0][kind][2]
        assert mode == ("element" if world == 3 else "shard"), (kind, world, mode)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("n_shards", "kind", "mode"),  # 2 ranks x 2 workers
                         [(8, "torch", "shard"),
                          pytest.param(5, "hf", "element", marks=pytest.mark.extended)])
def test_same_size_resume_continues_bit_exactly_with_workers(tmp_path: Path, n_shards: int,
                                                              kind: str, mode: str) -> None:
    sizes = tuple(6 + (i % 2) for i in range(n_shards))
    args = ((kind,), 2, sizes, 3)  # stop after 3 steps: an odd count rotates the workers
    full = spawn(phase, 2, str(tmp_path / "a"), None, *args, timeout=150, env=ENV)
    first = spawn(phase, 2, str(tmp_path / "b"), 3, *args, timeout=150, env=ENV)
    rest = spawn(phase, 2, str(tmp_path / "b"), None, *args, timeout=150, env=ENV)
    for r in range(2):
        assert full[r][kind][2] == mode
        assert len(full[r][kind][1]) > 4
        assert first[r][kind][1] + rest[r][kind][1] == full[r][kind][1], r
