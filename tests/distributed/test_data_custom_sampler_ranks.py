"""A sampler of the user's own (WeightedRandomSampler) through run.loader at two processes,
saved mid-epoch and resumed by new launches: at two processes on the same batches, at one
process on exactly the samples the epoch had left."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset, WeightedRandomSampler

import splitsync as ss
from splitsync.testing import spawn

pytestmark = pytest.mark.slow

N, DRAWS, BEFORE = 23, 17, 3  # dataset, indices per epoch, batches read before the save


def _loader(run: ss.Run) -> Any:
    weights = torch.linspace(1.0, 3.0, N)
    sampler = WeightedRandomSampler(weights, num_samples=DRAWS, replacement=True)
    return run.loader(TensorDataset(torch.arange(N)), batch_size=2, sampler=sampler,
                      drop_last=False)


def _first(rank: int, world: int, root: str) -> dict[str, Any]:
    with ss.init(seed=5) as run:
        loader = _loader(run)
        loader.set_epoch(0)
        batches = iter(loader)
        before = [next(batches)[0].tolist() for _ in range(BEFORE)]
        run.save(root, step=BEFORE)
        rest = [b[0].tolist() for b in batches]
        padding = loader.sampler.padding
        return {"before": before, "rest": rest, "padding": padding,
                "order": loader.sampler.global_order()}


def _resumed(rank: int, world: int, root: str) -> list[list[int]]:
    with ss.init(seed=5) as run:
        loader = _loader(run)
        state = run.resume(root)  # nothing but loaders and RNG to restore
        assert state.resumed and state.step == BEFORE
        loader.set_epoch(state.epoch)
        return [b[0].tolist() for b in loader]


def test_a_custom_sampler_resumes_at_the_same_and_another_world_size(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    first = spawn(_first, 2, root, timeout=180)
    order = first[0]["order"]
    assert order == first[1]["order"] and len(order) == DRAWS  # both ranks drew one order
    again = spawn(_resumed, 2, root, timeout=180)
    for f, r in zip(first, again, strict=True):  # the same samples, bar the padded repeat
        # at the epoch's end (a resumed pass repeats one of what remained, not of the epoch)
        flat, real = [i for b in r for i in b], [i for b in f["rest"] for i in b]
        assert flat[: len(flat) - f["padding"]] == real[: len(real) - f["padding"]]
    (alone,) = spawn(_resumed, 1, root, timeout=180)
    consumed = BEFORE * 2 * 2
    assert Counter(i for b in alone for i in b) == Counter(order[consumed:])
