"""plan --memory against what real 2-rank gloo groups hold under DDP and FSDP2."""

from __future__ import annotations

import pytest
import torch

from splitsync.bench.memmodels import MODELS, sample
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
