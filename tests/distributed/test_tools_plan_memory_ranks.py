"""plan --memory against what real 2-rank gloo groups hold under DDP and FSDP2."""

from __future__ import annotations

import pytest
import torch
from memmodels import MODELS, sample

from splitsync.testing import spawn
from splitsync.tools.plan.memory import Variant, model_facts, plan

pytestmark = pytest.mark.timeout(240)
BATCH = 4


def held_rank(rank: int, world: int) -> dict:
    import splitsync as ss
    from splitsync.tools.plan.held import held_bytes

    out = {}
    holder = ss.init(seed=0)  # one process group (and device mesh) for every run
    try:
        for strategy in ("ddp", "fsdp"):
            for name, (factory, _, _) in MODELS.items():
                with ss.init(seed=0, strategy=strategy) as run:
                    model = run.model(factory())
                    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
                    out[strategy, name] = held_bytes(run, model, opt, sample(name, BATCH, rank))
    finally:
        holder.close()
    return out


@pytest.mark.slow
def test_plan_memory_matches_what_ranks_hold() -> None:
    measured = spawn(held_rank, 2, timeout=200)[0]  # rank 0: the most loaded one
    for name, (factory, shape, dtype) in MODELS.items():
        facts = model_facts(factory, shape, BATCH, input_dtype=dtype)
        for p in plan(facts, [Variant("ddp"), Variant("fsdp")], [2]):
            real = measured[p.strategy, name]
            for key, tol in (("params_bytes", 0.05), ("grads_bytes", 0.05),
                             ("optimizer_bytes", 0.05), ("activations_bytes", 0.25)):
                want, got = getattr(p, key), real[key]
                assert abs(want - got) <= tol * got, f"{name} {p.strategy} {key}: " \
                    f"predicted {want}, held {got}"


def hsdp_rank(rank: int, world: int) -> dict:
    """HSDP, 2 replicas x 2 shards: what a rank holds, and an EMA sharded like the model."""
    from memmodels import mlp

    import splitsync as ss
    from splitsync.tools.plan.held import held_bytes

    with ss.init(seed=0, strategy="hsdp") as run:
        model = run.model(mlp(), replicate=2)
        ema = run.ema(model, decay=0.5)
        start = [p.to_local().clone() for p in ema.parameters()]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        held = held_bytes(run, model, opt, sample("mlp", BATCH, rank))
        pairs = list(zip(ema.parameters(), model.parameters(), strict=True))
        worst = max(float((e.to_local() - (0.5 * s + 0.5 * w.to_local())).abs().max())
                    for (e, w), s in zip(pairs, start, strict=True))
        same_layout = all(e.placements == w.placements and e.device_mesh == w.device_mesh
                          and e.to_local().shape == w.to_local().shape for e, w in pairs)
    return {"held": held, "ema_worst": worst, "same_layout": same_layout}


@pytest.mark.slow
def test_plan_memory_and_ema_under_hsdp_at_4_ranks() -> None:
    results = spawn(hsdp_rank, 4, timeout=200)
    for r in results:
        assert r["same_layout"] and r["ema_worst"] <= 1e-6
    factory, shape, dtype = MODELS["mlp"]
    (p,) = plan(model_facts(factory, shape, BATCH, input_dtype=dtype), [Variant("hsdp")], [4],
                per_node=2)
    assert p.shard == 2
    real = results[0]["held"]
    for key, tol in (("params_bytes", 0.05), ("grads_bytes", 0.05), ("optimizer_bytes", 0.05),
                     ("activations_bytes", 0.25)):
        assert abs(getattr(p, key) - real[key]) <= tol * real[key], (key, getattr(p, key), real)
