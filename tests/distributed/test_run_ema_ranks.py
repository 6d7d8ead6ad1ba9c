"""run.ema on real 2-rank gloo groups: the formula after real steps only, FSDP sharding, export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from splitsync.testing import spawn

pytestmark = pytest.mark.timeout(240)

DECAY = 0.75  # far from 1, so that a missed or extra update shows


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)  # float buffers (averaged) and a counter (copied)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.norm(self.fc(x)))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), Block(), Block(), nn.Linear(8, 2))


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, whole, by the user's names."""
    out = {}
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        t = t.detach()
        full = getattr(t, "full_tensor", None)
        out[name.removeprefix("module.")] = (full() if full is not None else t).clone()
    return out


def _train(run, strategy: str, accumulate: int, tmp: str) -> dict:
    from torch.distributed.tensor import DTensor

    model = run.model(_net(), strategy=strategy)
    ema = run.ema(model, decay=DECAY)
    with torch.no_grad():  # a forward first: FSDP2's lazy init re-pads the shards it holds
        ema.eval()(torch.ones(2, 6))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    expected = _full(model)
    start = {k: v.clone() for k, v in expected.items()}
    first = {k: torch.equal(v, _full(ema)[k]) for k, v in start.items()}
    g = torch.Generator().manual_seed(7 + run.rank)
    worst, updates, still_after_micro = 0.0, 0, True
    for i in range(3 * accumulate):
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
        before = _full(ema)
        run.backward(nn.functional.mse_loss(model(x), y))
        run.step(opt)
        now = _full(model)
        if (i + 1) % accumulate == 0:  # a real step: the formula, on every tensor
            updates += 1
            for k, w in now.items():
                expected[k] = (DECAY * expected[k] + (1 - DECAY) * w if w.is_floating_point()
                               else w.clone())
        else:  # a micro-step: the EMA must not move
            still_after_micro &= all(torch.equal(before[k], v) for k, v in _full(ema).items())
        got = _full(ema)
        worst = max(worst, max(float((got[k].double() - v.double()).abs().max())
                               for k, v in expected.items()))
    moved = max(float((expected[k] - start[k]).abs().max()) for k in start
                if start[k].is_floating_point())
    out = Path(tmp) / f"{strategy}-{accumulate}.safetensors"
    run.export(out, model=ema)
    if strategy == "fsdp" and accumulate == 2:  # a sharded (DCP) checkpoint holds the EMA
        run.resume(Path(tmp) / "ck", model=model, optimizer=opt)  # with no extra argument
        run.save(step=3)
    shards = [p for p in ema.parameters() if isinstance(p, DTensor)]
    return {
        "worst": worst, "updates": updates, "moved": moved, "first": all(first.values()),
        "still": still_after_micro, "frozen": not any(p.requires_grad for p in ema.parameters()),
        "sharded": bool(shards) and all(p.to_local().numel() * run.world_size >= p.numel()
                                        and p.to_local().numel() < p.numel() for p in shards
                                        if p.shape[0] >= run.world_size),
        "n_shards": len(shards), "expected": expected, "export": str(out),
        "eval": float(ema.eval()(torch.ones(2, 6)).sum()),
        "eval_ref": _eval_ref(expected),
    }


def _eval_ref(state: dict[str, torch.Tensor]) -> float:
    ref = _net()
    ref.load_state_dict(state)
    with torch.no_grad():
        return float(ref.eval()(torch.ones(2, 6)).sum())


def ema_rank(rank: int, world: int, tmp: str) -> list:
    import splitsync as ss

    results = []
    holder = ss.init(seed=0)  # one process group (and so one device mesh) for every run
    try:
        # the last one trained saves the checkpoint the restart below resumes
        for strategy, accumulate in (("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2)):
            with ss.init(seed=0, strategy=strategy, accumulate=accumulate) as run:
                results.append((strategy, accumulate, _train(run, strategy, accumulate, tmp)))
        with ss.init(seed=0, strategy="fsdp") as run:  # a restart: fresh weights, then resume
            model = run.model(_net())
            ema = run.ema(model, decay=DECAY)
            opt = torch.optim.AdamW(model.parameters(), lr=0.05)
            fresh = _full(ema)
            state = run.resume(Path(tmp) / "ck", model=model, optimizer=opt)
            results.append(("resumed", state.step, {"fresh": fresh, "ema": _full(ema)}))
    finally:
        holder.close()
    return results


@pytest.mark.slow
def test_ema_follows_the_formula_on_real_steps_under_ddp_and_fsdp(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    per_rank = spawn(ema_rank, 2, str(tmp_path), timeout=200)
    *trained, (_, step, resumed) = per_rank[0]
    assert step == 3
    assert [(s, a) for s, a, _ in trained] == [("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2)]
    saved = trained[-1][2]["expected"]  # fsdp, accumulate=2: the EMA that was saved
    # parameters; BatchNorm's running stats differ by rank under FSDP (the model's too) and
    # a checkpoint keeps one rank's
    off = [k for k, v in saved.items() if "running" not in k
           and not torch.allclose(resumed["ema"][k], v, atol=1e-6)]
    assert not off, f"the resumed EMA differs from the saved one in {off}"
    assert not all(torch.equal(resumed["fresh"][k], v) for k, v in saved.items())
    for strategy, accumulate, r in trained:
        what = f"{strategy}, accumulate={accumulate}"
        assert r["first"], f"{what}: the EMA does not start as a copy of the weights"
        assert r["updates"] == 3 and r["moved"] > 1e-3, what
        assert r["worst"] <= 1e-6, f"{what}: EMA off the formula by {r['worst']}"
        assert r["still"], f"{what}: an accumulation micro-step moved the EMA"
        assert r["frozen"], f"{what}: EMA parameters require grad"
        assert abs(r["eval"] - r["eval_ref"]) <= 1e-5, f"{what}: the EMA's forward"
        exported = load_file(r["export"])
        assert exported.keys() == r["expected"].keys(), what
        assert all(torch.allclose(exported[k], v, atol=1e-6) for k, v in r["expected"].items())
        if strategy == "fsdp":  # sharded like the model: DTensors, half of each on a rank
            assert r["n_shards"] == len(list(_net().parameters())) and r["sharded"], what
        else:
            assert r["n_shards"] == 0, what
    for (_, _, a), (_, _, b) in zip(per_rank[0][:-1], per_rank[1][:-1], strict=True):
        params = [k for k in a["expected"] if "running" not in k and "batches" not in k]
        assert all(torch.equal(a["expected"][k], b["expected"][k]) for k in params)


def batchnorm_rank(rank: int, world: int, tmp: str) -> dict:
    """Plain BatchNorm under DDP: each rank's EMA statistics are its own; a checkpoint gives
    each rank back its own, and sync_batchnorm_stats makes them every rank's mean."""
    import splitsync as ss

    def train(run, model, opt, steps: int) -> None:
        g = torch.Generator().manual_seed(100 + rank + 10 * steps)
        for _ in range(steps):
            x = torch.randn(4, 6, generator=g) * (1 + rank)  # ranks see different data
            run.backward(model(x).pow(2).mean())
            run.step(opt)

    holder = ss.init(seed=0)  # one process group for both runs
    try:
        with ss.init(seed=0, strategy="ddp") as run:
            model = run.model(_net())
            ema = run.ema(model, decay=DECAY)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            run.resume(Path(tmp) / "bn", model=model, optimizer=opt)
            train(run, model, opt, 3)
            run.save()
            saved = _full(ema)
            train(run, model, opt, 2)
            final = _full(ema)
        with ss.init(seed=0, strategy="ddp") as run:  # a restart at step 3
            model = run.model(_net())
            ema = run.ema(model, decay=DECAY)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            run.resume(Path(tmp) / "bn", model=model, optimizer=opt)
            resumed = _full(ema)
            train(run, model, opt, 2)
            again = _full(ema)
            run.sync_batchnorm_stats(ema)
            synced = _full(ema)
    finally:
        holder.close()
    return {"saved": saved, "resumed": resumed, "final": final, "again": again,
            "synced": synced}


@pytest.mark.slow
def test_each_rank_keeps_its_own_batchnorm_statistics_across_a_resume(tmp_path: Path) -> None:
    r0, r1 = spawn(batchnorm_rank, 2, str(tmp_path), timeout=200)
    stats = [k for k in r0["saved"] if "running" in k]
    assert stats and any(not torch.equal(r0["saved"][k], r1["saved"][k]) for k in stats)
    for r in (r0, r1):  # bit-exact on every rank, its own statistics included
        assert all(torch.equal(r["resumed"][k], v) for k, v in r["saved"].items())
        assert all(torch.equal(r["again"][k], v) for k, v in r["final"].items())
    for k in stats:  # the mean over the ranks, the same on both
        assert torch.equal(r0["synced"][k], r1["synced"][k])
        assert torch.allclose(r0["synced"][k], (r0["again"][k] + r1["again"][k]) / 2, atol=1e-6)
    others = [k for k in r0["saved"] if "running" not in k]
    assert all(torch.equal(r0["synced"][k], r0["again"][k]) for k in others)
