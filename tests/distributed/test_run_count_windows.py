"""``run.backward(loss, count=n)`` at the accumulation window's edges: a save inside a counted
window (the docs' epoch-end ``run.save``), and the run's last window when the micro-batches
are not a multiple of ``accumulate``.

A counted window carries more than its micro-steps and gradients: this rank's items so far,
that it is counted, and the power of two its losses were multiplied by. A checkpoint that
dropped them resumed into a window that refused the next counted backward as mixed (or, had
it gone on, divided by the items of half a window).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from resumekit import Config, check_all
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss
from splitsync.testing import spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("world", [1, 2])
def test_an_epoch_end_save_inside_a_counted_window_resumes_bit_equal(tmp_path: Path,
                                                                    world: int) -> None:
    """5 micro-batches of one sample per rank and epoch, 3 epochs, ``count=`` with every
    fourth sample holding no item: saves 1 of 2, 2 of 3 and 1 of 3 micro-steps into a
    window, and the run's last window holds 1 of 2 (and 15 micro-batches end in it)."""
    n = 5 * world
    cfgs = [Config(n=n, world=world, batch=1, accumulate=accumulate, epochs=3, count=True,
                   strategy="ddp", save_at=save_at, kill_at=save_at + 1)
            for accumulate, save_at in ((2, 5), (3, 5), (3, 10))]
    if world == 2:  # FSDP2: the window's unsharded gradients, the shards rescaled after it
        cfgs += [Config(n=31, world=2, batch=2, accumulate=3, strategy="fsdp", count=True,
                        save_at=save, kill_at=save + 2) for save in (7, 8)]
    for cfg, problems in zip(cfgs, check_all(cfgs, tmp_path), strict=True):
        assert problems == [], cfg.describe()


VOCAB, SEQ, LR = 11, 6, 0.05
# real tokens of each sequence: 9 of them, so 2 ranks pad one; a zero is one of padding only
LENGTHS = (5, 0, 3, 0, 6, 0, 0, 2, 4)


class Sequences(Dataset):
    """Ragged token sequences (right padding) that carry their index."""

    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        tokens = torch.randint(0, VOCAB, (SEQ + 1,), generator=torch.Generator().manual_seed(i))
        return tokens, (torch.arange(SEQ) < LENGTHS[i]).double(), i


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 5), nn.Linear(5, 5), nn.Tanh(),
                         nn.Linear(5, VOCAB)).double()


def _loss(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over real tokens (0/0 for a micro-batch without any, as scripts write it)."""
    logits = model(tokens[:, :-1])
    per_token = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return (per_token * mask).sum() / mask.sum()


def _last_window_rank(rank: int, world: int, accumulate: int, epochs: int) -> dict[str, Any]:
    with ss.init(seed=0, strategy="ddp", accumulate=accumulate) as run:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        loader = run.loader(Sequences(), batch_size=2, shuffle=True)
        seen: list[list[int]] = []  # the samples of each micro-batch, padding included
        for _ in run.epochs(epochs):
            for tokens, mask, idx in loader:
                run.backward(_loss(model, tokens, mask), count=mask.sum())
                run.step(opt)
                seen.append(idx.tolist())
        weights = torch.cat([p.detach().flatten() for p in run.unwrap(model).parameters()])
        counting = run._training.plan.counting
        return {"weights": weights, "seen": seen, "steps": float(
            next(iter(opt.state.values()))["step"]), "hooked": bool(counting.syncs)}


def _one_process(ranks: list[dict[str, Any]], accumulate: int) -> tuple[torch.Tensor, int]:
    """One process on each step's global batch (every rank's micro-batches of the window),
    the mean over all its real tokens; a step without any is skipped."""
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    data, micro, steps = Sequences(), len(ranks[0]["seen"]), 0
    for start in range(0, micro, accumulate):
        ids = [i for r in ranks for batch in r["seen"][start:start + accumulate] for i in batch]
        tokens, mask, _ = zip(*(data[i] for i in ids), strict=True)
        mask_all = torch.stack(mask)
        if not mask_all.sum():
            continue
        _loss(model, torch.stack(tokens), mask_all).backward()
        opt.step()
        opt.zero_grad()
        steps += 1
    return torch.cat([p.detach().flatten() for p in model.parameters()]), steps


@pytest.mark.parametrize("world", [1, 2])
def test_the_last_partial_counted_window_is_the_mean_over_its_tokens(world: int) -> None:
    """5 micro-batches per rank and epoch at 1 process (3 at 2: 9 sequences, batch 2),
    3 epochs, accumulate 2: 15 (9) micro-batches, so the run's last window holds one, read
    through run.loader and run.epochs. Windows span epochs; some micro-batches hold no
    real token. Every rank ends on the weights of one process on the global batches."""
    accumulate, epochs = 2, 3
    ranks = spawn(_last_window_rank, world, accumulate, epochs, timeout=240)
    micro = len(ranks[0]["seen"])
    assert micro % accumulate == 1 and all(len(r["seen"]) == micro for r in ranks)
    ref, steps = _one_process(ranks, accumulate)
    for res in ranks:
        assert (res["weights"] - ref).abs().max().item() <= 1e-9
        assert res["steps"] == steps  # the last window stepped (and only one window more)
        # at 2 ranks the count rides in DDP's gradient all-reduce (the comm hook), so the
        # last window's early end reaches the hook, not only the step's rescale
        assert res["hooked"] == (world > 1)
