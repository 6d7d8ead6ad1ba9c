"""``run.backward(loss, count=n)``: ragged masked LM batches train like one process on the
global batch (the mean over every real token), at every layout and strategy.

One spawn serves every check: 4 ranks (DDP 4x1, HSDP 2 replicas x 2 shards), then ranks 0
and 1 as a 2-rank group (DDP and FSDP with 2 micro-batches each), then rank 0 alone (DDP on
a 1-rank group, 1x1 and 1x4). Each layout trains in float64 and under bf16-mixed. Some
micro-batches hold no real token (at 4x1 a whole rank), and the last step holds none at
all: it must not step.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import splitsync as ss
from splitsync.observe import Observer
from splitsync.testing import spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VOCAB, DIM, SEQ, BATCH = 13, 8, 7, 8  # BATCH: the global batch of sequences per step
LR, CLIP = 0.05, 0.05
# Real tokens per sequence, step by step. Each pair of sequences is one (rank, micro-batch)
# slice at 4 slices per step: a zero pair is a micro-batch without any real token (the second
# pair at 4x1 is a whole rank). The last step has none at all.
LENGTHS = ((5, 1, 0, 0, 7, 2, 1, 3), (0, 0, 4, 6, 2, 0, 7, 1), (3, 3, 1, 0, 0, 0, 5, 5),
           (0,) * BATCH)
REAL_STEPS = 3  # the steps with tokens


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


def net(dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, DIM), Block(), Block(),
                         nn.Linear(DIM, VOCAB)).to(dtype)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step: tokens, and the mask of real ones (right padding)."""
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    lengths = torch.tensor(LENGTHS[step])
    mask = (torch.arange(SEQ)[None] < lengths[:, None]).double()
    return tokens, mask


def masked_mean(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor,
                guarded: bool = False) -> torch.Tensor:
    """The usual LM loss: next-token cross-entropy, the mean over real tokens only (0/0
    for a micro-batch without any, unless ``guarded``)."""
    logits = model(tokens[:, :-1]).double()
    per_token = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return (per_token * mask).sum() / (mask.sum().clamp(min=1) if guarded else mask.sum())


class Stepped(Observer):
    """Whether each run.step really stepped."""

    def __init__(self) -> None:
        self.stepped: list[bool] = []

    def on_step_end(self, optimizer: Any, norm: Any, stepped: bool = True) -> None:
        self.stepped.append(stepped)


def full(model: nn.Module) -> torch.Tensor:
    parts = []
    for p in model.parameters():
        t = p.detach()
        whole = getattr(t, "full_tensor", None)
        parts.append((whole() if whole is not None else t).double().flatten())
    return torch.cat(parts)


def reference(clip: float | None = None) -> dict[str, Any]:
    """One process, the whole global batch per step, the mean over all real tokens."""
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    ema = full(model)
    norms = []
    for s in range(REAL_STEPS):
        masked_mean(model, *batch(s)).backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        opt.zero_grad()
        ema = 0.5 * ema + 0.5 * full(model)
    return {"weights": full(model), "norms": norms, "ema": ema}


def train(run: ss.Run, model: nn.Module, micro: int, *, count: bool = True,
          clip: float | None = None) -> dict[str, Any]:
    """Each rank its slices of every global batch, ``micro`` micro-batches per step."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    size = BATCH // run.world_size // micro
    norms = []
    watch = run.add_observer(Stepped())
    for s in range(len(LENGTHS)):
        tokens, mask = batch(s)
        for m in range(micro):
            at = (m * run.world_size + run.rank) * size
            x, real = tokens[at:at + size], mask[at:at + size]
            if count:
                run.backward(masked_mean(model, x, real), count=real.sum())
            else:  # the mean of means, as scripts do
                run.backward(masked_mean(model, x, real, guarded=True))
            norm = run.step(opt, clip=clip).norm
        norms.append(None if norm is None else float(norm))
    run.remove_observer(watch)
    stepped = watch.stepped[micro - 1::micro]  # the steps that end a window
    steps = [float(st["step"]) for st in opt.state.values()][:1]
    return {"weights": full(model), "norms": norms, "stepped": stepped, "opt_steps": steps}


def layouts(rank: int, world: int, strategy: str, micro: int,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One layout in float64 and under bf16-mixed (and the variants that ride along)."""
    out: dict[str, Any] = {}
    options = dict(extra or {})
    for precision in ("32", "bf16-mixed"):
        # float32 under bf16-mixed: autocast leaves float64 alone
        dtype = torch.float64 if precision == "32" else torch.float32
        with ss.init(seed=0, strategy=strategy, accumulate=micro, precision=precision) as run:
            model = run.model(net(dtype), **options)
            ema = run.ema(model, decay=0.5) if precision == "32" else None
            out[precision] = train(run, model, micro)
            if ema is not None:
                out["ema"] = full(ema)
            if precision == "32" and strategy == "ddp":
                out["clip"] = train(run, run.model(net()), micro, clip=CLIP)
                out["no count"] = train(run, run.model(net()), micro, count=False)
                # a comm hook of the user's: DDP averages, the step rescales
                out["own hook"] = train(run, run.model(net(), comm_hook="allreduce"), micro)
    return out


def group_rank(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    from splitsync.distributed.ports import free_port

    dist.init_process_group("gloo")  # each ss.init below finds it and leaves it up
    out = {"ddp 4x1": layouts(rank, world, "ddp", 1),
           "hsdp 2x2": layouts(rank, world, "hsdp", 1, {"replicate": 2})}
    for size, runs in ((2, ("ddp 2x2", "fsdp 2x2")), (1, ("ddp 1x1", "ddp 1x4"))):
        port = [free_port() if rank == 0 else 0]
        dist.broadcast_object_list(port)
        dist.destroy_process_group()
        if rank >= size:
            return out
        os.environ.update(WORLD_SIZE=str(size), LOCAL_WORLD_SIZE=str(size),
                          MASTER_PORT=str(port[0]))
        dist.init_process_group("gloo")
        for name in runs:
            strategy, shape = name.split()
            out[name] = layouts(rank, size, strategy, int(shape.split("x")[1]))
    return out


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    ranks = spawn(group_rank, 4, timeout=500)
    return {"ranks": ranks, "ref": reference(), "clip": reference(CLIP)}


NAMES = ("ddp 1x1", "ddp 1x4", "ddp 2x2", "ddp 4x1", "fsdp 2x2", "hsdp 2x2")


def _per_rank(runs: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r[name] for r in runs["ranks"] if name in r]


@pytest.mark.parametrize("name", NAMES)
def test_float64_equals_one_process_on_the_global_batch(runs: dict, name: str) -> None:
    ref = runs["ref"]["weights"]
    for res in _per_rank(runs, name):
        assert (res["32"]["weights"] - ref).abs().max().item() <= 1e-9
        # the step without a token anywhere did not step: 3 optimizer steps, not 4
        assert res["32"]["stepped"] == [True, True, True, False]
        assert res["32"]["opt_steps"] == [3.0]
        assert (res["ema"] - runs["ref"]["ema"]).abs().max().item() <= 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_bf16_mixed_has_no_nan_and_stays_within_bf16_noise(runs: dict, name: str) -> None:
    # How far the weights are from float64's, relative to how far training moved them:
    # about 0.05-0.08 under bf16-mixed with count= (a few elements whose tiny gradient
    # changes sign in bfloat16 move by AdamW's full step); the mean of means is at 0.45-0.54.
    ref = runs["ref"]["weights"]
    moved = (ref - full(net())).norm()
    for res in _per_rank(runs, name):
        weights = res["bf16-mixed"]["weights"]
        assert torch.isfinite(weights).all()
        assert ((weights - ref).norm() / moved).item() <= 0.15


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("ddp")])
def test_a_ddp_model_with_its_own_comm_hook_is_rescaled_by_the_step(runs: dict,
                                                                    name: str) -> None:
    for res in _per_rank(runs, name):
        assert (res["own hook"]["weights"] - runs["ref"]["weights"]).abs().max().item() <= 1e-9
        assert res["own hook"]["stepped"] == [True, True, True, False]


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("ddp")])
def test_clip_sees_the_gradient_of_the_global_mean(runs: dict, name: str) -> None:
    for res in _per_rank(runs, name):
        norms = res["clip"]["norms"]
        assert norms[-1] is None  # the empty step clipped nothing
        assert norms[:-1] == pytest.approx(runs["clip"]["norms"], rel=1e-9)
        assert (res["clip"]["weights"] - runs["clip"]["weights"]).abs().max().item() <= 1e-9


@pytest.mark.parametrize("name", ["ddp 1x4", "ddp 2x2", "ddp 4x1"])
def test_without_count_the_mean_of_means_differs(runs: dict, name: str) -> None:
    ref = runs["ref"]["weights"]
    for res in _per_rank(runs, name):
        assert (res["no count"]["weights"] - ref).abs().max().item() > 1e-3


def _wide() -> nn.Module:
    # 1.4 MB in the middle layer: more than DDP's first bucket (1 MB), so several buckets
    return nn.Sequential(nn.Linear(3, 600), nn.Tanh(), nn.Linear(600, 600), nn.Tanh(),
                         nn.Linear(600, 1))


def _many_buckets_rank(rank: int, world: int) -> dict:
    """count= under DDP with several buckets: the count rides with the smallest one, the
    others are reduced in place, and the gradients are the mean over every item."""
    import splitsync as ss

    torch.manual_seed(0)
    net = _wide()
    with ss.init(seed=0, strategy="ddp", accumulate=2) as run:
        model = run.model(net, bucket_cap_mb=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the same weights at both steps
        seen: dict[str, torch.Tensor] = {}
        storages: set[int] = set()  # gradients are views of their buckets: one storage each

        def before_step(*_: Any) -> None:
            for k, p in model.module.named_parameters():
                seen[k] = p.grad.clone()
                storages.add(p.grad.untyped_storage().data_ptr())

        opt.register_step_pre_hook(before_step)
        g = torch.Generator().manual_seed(rank)
        # three steps (DDP lays out its buckets anew after the first; the hook learns the
        # layout in the second), each of two micro-batches of different sizes per rank
        for n in (1 + rank, 3) * 3:
            storages.clear()
            x = torch.randn(n, 3, generator=g)
            run.backward(model(x).pow(2).mean(), count=n)
            run.step(opt)
        syncs = run._plan.counting.syncs
        packed = syncs[0].state.packed
    return {"grads": seen, "packed": {i: t[1].numel() for i, t in packed.items()},
            "params": sum(p.numel() for p in net.parameters()),
            "buckets": len(storages)}


@pytest.mark.slow
def test_ddp_count_copies_the_smallest_bucket_only() -> None:
    out = spawn(_many_buckets_rank, 2, timeout=150)
    r0 = out[0]
    assert r0["buckets"] > 1, "the model should have several buckets"
    (carrier, size), = r0["packed"].items()  # one bucket copied, the smallest
    assert carrier != 0 and size < r0["params"] / 100
    # the mean over every item of both ranks, computed in one process
    torch.manual_seed(0)
    net = _wide()
    xs = []
    for rank in (0, 1):
        g = torch.Generator().manual_seed(rank)
        xs += [torch.randn(n, 3, generator=g) for n in (1 + rank, 3) * 3][4:]
    sum(net(x).pow(2).sum() for x in xs).div(sum(len(x) for x in xs)).backward()
    for k, p in net.named_parameters():
        assert torch.allclose(r0["grads"][k], p.grad, atol=1e-6), k
        assert torch.equal(r0["grads"][k], out[1]["grads"][k]), k
