"""FSDP2 on real 2-rank gloo groups matches single-process training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from splitsync.testing import spawn

pytestmark = pytest.mark.timeout(200)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), Block(), Block(), nn.Linear(8, 2))


def _full(model: nn.Module) -> torch.Tensor:
    parts = []
    for p in model.parameters():
        t = p.detach()
        full = getattr(t, "full_tensor", None)
        parts.append((full() if full is not None else t).flatten())
    return torch.cat(parts)


def _reference(x: torch.Tensor, y: torch.Tensor, steps: int, clip: float | None) -> tuple:
    ref = _net()
    opt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    norms = []
    per = len(x) // steps
    for s in range(steps):
        nn.functional.mse_loss(ref(x[s * per:(s + 1) * per]), y[s * per:(s + 1) * per]).backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)))
        opt.step()
        opt.zero_grad()
    return _full(ref), norms


def fsdp_rank(rank: int, world: int, accumulate: int, clip: float | None) -> dict:
    from torch.distributed.fsdp import FSDPModule

    import splitsync as ss

    steps, micro = 3, 4
    g = torch.Generator().manual_seed(3)
    n = steps * accumulate * micro * world
    x, y = torch.randn(n, 6, generator=g) * 3, torch.randn(n, 2, generator=g)
    with ss.init(seed=0, strategy="fsdp", accumulate=accumulate) as run:
        model = run.model(_net())
        sharded = [type(m).__name__ for m in model.modules() if isinstance(m, FSDPModule)]
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        norms = []
        for s in range(steps):
            for m in range(accumulate):
                start = ((s * accumulate + m) * world + rank) * micro
                loss = nn.functional.mse_loss(model(x[start:start + micro]),
                                              y[start:start + micro])
                run.backward(loss)
                norm = run.step(opt, clip=clip).norm  # None: no clip, or a micro-step
                if norm is not None:
                    norms.append(float(norm))
        params = _full(model)
    ref, ref_norms = _reference(x, y, steps, clip)
    return {"diff": (params - ref).abs().max().item(), "norms": norms, "ref_norms": ref_norms,
            "sharded": sharded}


@pytest.mark.parametrize(("accumulate", "clip"), [(1, None), (2, 0.05)],
                         ids=["plain", "accumulate-clip"])
def test_fsdp_two_ranks_match_single_process(accumulate: int, clip: float | None) -> None:
    for res in spawn(fsdp_rank, 2, accumulate, clip, timeout=180):
        assert res["diff"] < 1e-5
        # default blocks: the repeated type holding the most parameters, then the root
        assert sorted(res["sharded"]) == ["FSDPBlock", "FSDPBlock", "FSDPSequential"]
        if clip is not None:
            assert res["norms"] == pytest.approx(res["ref_norms"], rel=1e-5)
            assert max(res["norms"]) > clip  # clipping was active


def fsdp_precision_rank(rank: int, world: int) -> dict:
    import splitsync as ss

    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
    out = {}
    with ss.init(seed=0, strategy="fsdp", precision="bf16-mixed") as run:
        model = run.model(_net(), blocks=[Block], compile={"backend": "aot_eager"})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            pred = model(x)
            out["pred_dtype"] = str(pred.dtype)
            run.backward(nn.functional.mse_loss(pred.float(), y))
            run.step(opt, clip=1.0)
        out["param_dtype"] = str(next(model.parameters()).dtype)
        try:
            run.join(model)
        except ValueError as exc:
            out["join"] = str(exc)
        out["params"] = _full(model).tolist()
    return out


def test_fsdp_bf16_mixed_compiled_blocks_train_in_step() -> None:
    r0, r1 = spawn(fsdp_precision_rank, 2, timeout=180)
    assert r0["pred_dtype"] == "torch.bfloat16"
    assert r0["param_dtype"] == "torch.float32"  # sharded master weights stay fp32
    assert r0["params"] == r1["params"]
    assert "drop_last=True" in r0["join"]  # FSDP has no uneven-input support: said clearly


def optimizer_order_rank(rank: int, world: int, optimizer_first: bool) -> dict:
    import splitsync as ss

    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)
    with ss.init(seed=0, strategy="fsdp") as run:
        net = _net()
        if optimizer_first:  # nanoGPT's and the tutorials' order
            opt = torch.optim.AdamW(net.parameters(), lr=0.01)
            model = run.model(net)
        else:
            model = run.model(net)
            opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        before = _full(model).clone()
        run.backward(nn.functional.mse_loss(model(x), y))
        try:
            run.step(opt)
        except ss.StaleOptimizerError as exc:
            return {"error": str(exc)}
        for _ in range(2):  # steady state: the optimizer is known now
            run.backward(nn.functional.mse_loss(model(x), y))
            run.step(opt)
        return {"changed": float((_full(model) - before).abs().max()),
                "known": opt in run._training.steps}


def test_fsdp_optimizer_built_before_run_model_fails_loudly() -> None:
    for res in spawn(optimizer_order_rank, 2, True, timeout=180):
        msg = res["error"]
        assert "built before run.model" in msg and "'fsdp' replaced" in msg
        assert "Build the optimizer after run.model" in msg


def test_fsdp_optimizer_built_after_run_model_trains() -> None:
    for res in spawn(optimizer_order_rank, 2, False, timeout=180):
        assert res["changed"] > 1e-4 and res["known"]
