"""DDP training features on real 2-rank gloo groups: accumulation, clipping, hooks, join."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from splitsync.testing import spawn

pytestmark = pytest.mark.timeout(180)

K = 3  # micro-batches per optimizer step
MICRO = 4  # samples per micro-batch per rank


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def _data(world: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    n = steps * K * MICRO * world
    return torch.randn(n, 6, generator=g), torch.randn(n, 2, generator=g)


def _counting_hook(state: dict[str, int], bucket):  # noqa: ANN001 - DDP hook signature
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state["allreduce"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def accumulate_rank(rank: int, world: int, explicit: bool) -> dict:
    import splitsync as ss

    steps = 2
    x, y = _data(world, steps)
    with ss.init(seed=0, accumulate=K) as run:
        model = run.model(_net())
        calls = {"allreduce": 0}
        model.register_comm_hook(calls, _counting_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        counts, stepped = [], []
        for s in range(steps):
            for m in range(K):
                # rank r's micro-batch m of step s: a disjoint slice of the global batch
                start = ((s * K + m) * world + rank) * MICRO
                xb, yb = x[start:start + MICRO], y[start:start + MICRO]
                if explicit:
                    with run.accumulate(model):
                        loss = nn.functional.mse_loss(model(xb), yb)
                        run.backward(loss)
                else:
                    loss = nn.functional.mse_loss(model(xb), yb)
                    run.backward(loss)
                counts.append(calls["allreduce"])
                stepped.append(run.sync_gradients)
                run.step(opt)
        params = [p.detach().clone() for p in run.unwrap(model).parameters()]
    # reference: one SGD step per global batch (all ranks' k micro-batches concatenated)
    ref = _net()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    per_step = K * MICRO * world
    for s in range(steps):
        xb, yb = x[s * per_step:(s + 1) * per_step], y[s * per_step:(s + 1) * per_step]
        nn.functional.mse_loss(ref(xb), yb).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    diff = max((p - q).abs().max().item() for p, q in zip(params, ref.parameters(), strict=True))
    return {"counts": counts, "stepped": stepped, "diff": diff}


@pytest.mark.parametrize("explicit", [False, True], ids=["init-only", "context"])
def test_accumulation_matches_concatenated_batch_and_syncs_once(explicit: bool) -> None:
    results = spawn(accumulate_rank, 2, explicit, timeout=150)
    for res in results:
        assert res["diff"] < 1e-5
        # one bucket (tiny model): exactly one all-reduce per k micro-batches, on the k-th
        assert res["counts"] == [0, 0, 1, 1, 1, 2]
        assert res["stepped"] == [False, False, True, False, False, True]


def clip_hooks_rank(rank: int, world: int) -> dict:
    import splitsync as ss

    out: dict = {}
    x, y = _data(world, 1)
    xb, yb = x[rank * 8:(rank + 1) * 8] * 50, y[rank * 8:(rank + 1) * 8]
    with ss.init(seed=0) as run:
        # clipping: the norm is the global norm of the averaged gradients
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.backward(nn.functional.mse_loss(model(xb), yb))
        grads = [p.grad.clone() for p in model.parameters()]
        norm = run.step(opt, clip=0.5)
        out["norm"] = float(norm)
        out["manual_norm"] = float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        out["none_without_clip"] = run.step(opt).norm is None
        # compression hooks and DDP tuning options: training runs, ranks stay identical
        for hook, extra in [("fp16", {}),
                            ("powersgd", {"comm_hook_options": {"start_powerSGD_iter": 2,
                                                                "matrix_approximation_rank": 1}})]:
            m = run.model(_net(), comm_hook=hook, static_graph=True, bucket_cap_mb=1, **extra)
            o = torch.optim.SGD(m.parameters(), lr=0.1)
            for _ in range(3):
                run.backward(nn.functional.mse_loss(m(xb), yb))
                run.step(o)
            flat = torch.cat([p.detach().flatten() for p in m.parameters()])
            out[hook] = run.gather(flat.unsqueeze(0)).tolist()
        for bad in ("gzip", "bf16"):  # bf16 compression needs nccl/xccl, not gloo
            try:
                run.model(_net(), comm_hook=bad)
            except ValueError as exc:
                out[f"bad_{bad}"] = str(exc)
    return out


def test_clip_returns_global_norm_and_comm_hooks_train() -> None:
    r0, r1 = spawn(clip_hooks_rank, 2, timeout=150)
    assert r0["norm"] == pytest.approx(r1["norm"])
    assert r0["norm"] == pytest.approx(r0["manual_norm"], rel=1e-5)
    assert r0["norm"] > 0.5  # it actually had something to clip
    assert r0["none_without_clip"]
    for hook in ("fp16", "powersgd"):
        a, b = r0[hook]
        assert a == b  # identical parameters on both ranks
        assert a != pytest.approx([0.0] * len(a))
    assert "'powersgd'" in r0["bad_gzip"] and "gzip" in r0["bad_gzip"]
    assert "nccl" in r0["bad_bf16"] and "gloo" in r0["bad_bf16"]


def join_rank(rank: int, world: int) -> list[float]:
    import splitsync as ss

    n_batches = 5 if rank == 0 else 7
    g = torch.Generator().manual_seed(10 + rank)
    with ss.init(seed=0, timeout=60) as run:
        model = run.model(_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with run.join(model):
            for _ in range(n_batches):
                x, y = torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)
                run.backward(nn.functional.mse_loss(model(x), y))
                run.step(opt)
        return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def test_join_uneven_batches_finishes_with_identical_parameters() -> None:
    r0, r1 = spawn(join_rank, 2, timeout=120)
    assert r0 == r1
    assert r0 != torch.cat([p.detach().flatten() for p in _net().parameters()]).tolist()


def compile_rank(rank: int, world: int) -> dict:
    import splitsync as ss

    x, y = _data(world, 1)
    xb, yb = x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8]
    out = {}
    with ss.init(seed=0) as run:
        for compiled in (False, True):
            model = run.model(_net(), compile={"backend": "aot_eager"} if compiled else False)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(2):
                run.backward(nn.functional.mse_loss(model(xb), yb))
                run.step(opt)
            out[compiled] = torch.cat([p.detach().flatten() for p in model.parameters()])
            if compiled:
                # DDP stays the outer wrapper; the user's module inside it is compiled
                out["outer"] = type(model).__name__
                out["inner_compiled"] = run.unwrap(model)._compiled_call_impl is not None
    out["diff"] = (out.pop(True) - out.pop(False)).abs().max().item()
    return out


def test_compile_wraps_inside_ddp_and_trains_the_same() -> None:
    for res in spawn(compile_rank, 2, timeout=170):
        assert res["outer"] == "DistributedDataParallel"
        assert res["inner_compiled"]
        assert res["diff"] < 1e-5


def bf16_rank(rank: int, world: int) -> dict:
    import splitsync as ss

    x, y = _data(world, 2)
    with ss.init(seed=0, precision="bf16-mixed", accumulate=2) as run:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        losses, dtypes = [], set()
        for i in range(8):
            xb, yb = x[(2 * i + rank) * 4:(2 * i + rank + 1) * 4], y[(2 * i + rank) * 4:][:4]
            pred = model(xb)
            dtypes.add(str(pred.dtype))
            loss = nn.functional.mse_loss(pred.float(), yb)
            losses.append(float(run.mean(loss.detach())))
            run.backward(loss)
            run.step(opt, clip=1.0)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        return {"dtypes": sorted(dtypes), "params": flat.tolist(), "losses": losses}


def test_bf16_mixed_with_accumulation_under_ddp() -> None:
    r0, r1 = spawn(bf16_rank, 2, timeout=150)
    assert r0["dtypes"] == ["torch.bfloat16"]
    assert r0["params"] == r1["params"]
    assert r0["params"] != torch.cat([p.detach().flatten() for p in _net().parameters()]).tolist()


def rewrap_rank(rank: int, world: int, steps: int, cut: int, find_unused: bool) -> dict:
    """``steps`` steps in one DDP wrapper, and the same steps with a new wrapper (state
    loaded, as a resumed run does) from step ``cut`` on."""
    import copy

    import splitsync as ss

    def net() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                             nn.Linear(64, 1))

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 6, generator=g)
        return x, x.sum(1, keepdim=True)

    def train(model: nn.Module, opt: torch.optim.Optimizer, lo: int, hi: int) -> None:
        for step in range(lo, hi):
            x, y = batch(step)
            run.backward(nn.functional.mse_loss(model(x), y))
            run.step(opt)

    options = {"find_unused_parameters": True} if find_unused else {}
    with ss.init(seed=0, strategy="ddp", **options) as run:
        model = run.model(net())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        train(model, opt, 0, steps)
        whole = [p.detach().clone() for p in run.unwrap(model).parameters()]
        first = run.model(net())
        opt = torch.optim.AdamW(first.parameters(), lr=1e-2)
        train(first, opt, 0, cut)
        saved = copy.deepcopy((run.unwrap(first).state_dict(), opt.state_dict()))
        module = net()
        module.load_state_dict(saved[0])
        second = run.model(module)
        opt = torch.optim.AdamW(second.parameters(), lr=1e-2)
        opt.load_state_dict(saved[1])
        train(second, opt, cut, steps)
        parts = [p.detach().clone() for p in run.unwrap(second).parameters()]
    return {"equal": all(torch.equal(a, b) for a, b in zip(whole, parts, strict=True))}


@pytest.mark.slow
@pytest.mark.parametrize(("world", "find_unused"), [(3, False), (4, False), (3, True)])
def test_a_new_wrapper_sums_gradients_as_the_old_one(world: int, find_unused: bool) -> None:
    """A resumed run's new DDP wrapper takes its first step with the bucket layout of every
    later step: bit-equal to never re-wrapping at 3 and 4 ranks (plain DDP: 3e-8 apart)."""
    for res in spawn(rewrap_rank, world, 12, 7, find_unused, timeout=150):
        assert res["equal"]


def layout_rank(rank: int, world: int) -> list[list[str]]:
    import splitsync as ss

    with ss.init(seed=0, strategy="ddp") as run:
        net = nn.Sequential(nn.Linear(6, 300), nn.ReLU(), nn.Linear(300, 1200), nn.ReLU(),
                            nn.Linear(1200, 1))  # 1.5 MB of gradients: two buckets
        model = run.model(net)
        run.backward(model(torch.randn(4, 6)).sum())
        names = {p: n for n, p in net.named_parameters()}
        return [[names[p] for p in b.parameters()]
                for b in model.reducer._get_zeros_like_grad_buckets()]


@pytest.mark.slow
def test_buckets_begin_with_the_last_layers() -> None:
    """The fixed layout keeps DDP's overlap: the first bucket all-reduced holds the last
    layers, whose gradients backward produces first; the first layer comes last."""
    for buckets in spawn(layout_rank, 3, timeout=120):
        assert len(buckets) == 2
        assert "4.weight" in buckets[0] and buckets[-1] == ["0.bias", "0.weight"]
