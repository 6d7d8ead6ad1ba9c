"""Tensor parallelism on a (dp_shard, tp) mesh, 4 gloo ranks, against one process.

One spawn of 4 processes serves every check; each ``ss.init`` below builds its mesh on the
group the spawn formed. float64 throughout: the TP and FSDP reductions add the same numbers
in another order than one process does, and in float64 that reordering stays below 1e-12,
so a tolerance of 1e-9 separates it from any real difference (a gradient counted twice, a
missed all-reduce), which shows at 1e-3 and above.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss
from splitsync.testing import clean_env, spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VOCAB, DIM, HEADS, SEQ = 32, 16, 4, 8
GLOBAL, STEPS, N = 8, 3, 48  # sequences per optimizer step; steps per phase; samples
LR, CLIP, DECAY = 0.5, 0.3, 0.5


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under TP each rank holds HEADS / tp of them
        q, k, v = (f(x).view(b, t, -1, DIM // HEADS).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention()
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(torch.relu(self.up(self.ln2(x))))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"layers.*.attn.q": ColwiseParallel(), "layers.*.attn.k": ColwiseParallel(),
            "layers.*.attn.v": ColwiseParallel(), "layers.*.attn.o": RowwiseParallel(),
            "layers.*.up": ColwiseParallel(), "layers.*.down": RowwiseParallel()}


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return Tiny().double()


class Tokens(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(1000 + i)
        return torch.randint(0, VOCAB, (SEQ + 1,), generator=g), i


def valid(i: int) -> int:
    """Tokens of sample ``i`` that count (for count=): 1..SEQ, uneven across ranks."""
    return 1 + (i * 5) % SEQ


def loss_of(model: nn.Module, tokens: torch.Tensor, idx: torch.Tensor,
            masked: bool) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy; ``masked``: over each sample's first ``valid(i)`` tokens only."""
    logits = model(tokens[:, :-1])
    ce = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(),
                                     reduction="none").view(len(idx), SEQ)
    if not masked:
        return ce.mean(), ce.numel()
    mask = torch.stack([torch.arange(SEQ) < valid(int(i)) for i in idx]).to(ce.dtype)
    n = int(mask.sum())
    return (ce * mask).sum() / n, n


def full(model: nn.Module) -> torch.Tensor:
    parts = []
    for p in model.parameters():
        t = p.detach()
        whole = getattr(t, "full_tensor", None)
        parts.append((whole() if whole is not None else t).flatten())
    return torch.cat(parts)


def reference(steps: int, masked: bool = False,
              dtype: torch.dtype = torch.float64) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One process, the whole global batch per step: parameters after each step, and the EMA."""
    data = Tokens()
    model = tiny().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ema = full(model).clone()
    out = []
    for s in range(steps):
        batch = [data[i] for i in range(s * GLOBAL, (s + 1) * GLOBAL)]
        tokens = torch.stack([b[0] for b in batch])
        idx = torch.tensor([b[1] for b in batch])
        loss_of(model, tokens, idx, masked)[0].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        out.append(full(model))
        ema = DECAY * ema + (1 - DECAY) * out[-1]
    return out, ema


def train(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer, batches: Any, steps: int,
          masked: bool = False) -> tuple[list[torch.Tensor], list[list[int]]]:
    """``steps`` optimizer steps from ``batches`` (an iterator over a loader's pass); the
    parameters after each, and the ids read."""
    after, seen = [], []
    for _ in range(steps):
        ids: list[int] = []
        for _ in range(run.config.accumulate):
            tokens, idx = next(batches)
            loss, n = loss_of(model, tokens, idx, masked)
            run.backward(loss, count=n) if masked else run.backward(loss)
            ids += idx.tolist()
        run.step(opt, clip=CLIP)
        after.append(full(model))
        seen.append(ids)
    return after, seen


def tp_ranks(rank: int, world: int, root: str) -> dict[str, Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo")  # each ss.init below finds it and leaves it up
    out: dict[str, Any] = {}
    for name, mesh in (("dp2tp2", {"dp_replicate": 1, "dp_shard": -1, "tp": 2}),
                       ("tp4", {"tp": 4})):
        with ss.init(seed=0, mesh=mesh) as run:
            out[f"{name}.who"] = (run.dp_rank, run.dp_size, run.tp_rank, run.tp_size,
                                  run.mesh.mesh_dim_names, tuple(run.mesh.shape))
            model = run.model(tiny(), tp_plan=plan())
            ema = run.ema(model, decay=DECAY)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            loader = run.loader(Tokens(), GLOBAL // run.dp_size)
            out[f"{name}.params"], out[f"{name}.seen"] = train(run, model, opt, iter(loader),
                                                               STEPS)
            out[f"{name}.ema"] = full(ema)
            out[f"{name}.strategy"] = run.strategy_of(model).name
    # accumulation 2, count= over uneven items, a background save mid-run
    mesh = {"dp_shard": 2, "tp": 2}
    with ss.init(seed=0, mesh=mesh, accumulate=2) as run:
        model = run.model(tiny(), tp_plan=plan())
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        loader = run.loader(Tokens(), GLOBAL // run.dp_size // 2)
        run.resume(root, model=model, optimizer=opt)
        batches = iter(loader)
        first, seen = train(run, model, opt, batches, 2, masked=True)
        run.save(root, blocking=False)
        rest, more = train(run, model, opt, batches, STEPS - 2, masked=True)
        out["count.params"], out["count.seen"] = first + rest, seen + more
    with ss.init(seed=0, mesh=mesh, accumulate=2) as run:  # the same mesh: bit-equal
        model = run.model(tiny(), tp_plan=plan())
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        loader = run.loader(Tokens(), GLOBAL // run.dp_size // 2)
        out["same.step"] = run.resume(root, model=model, optimizer=opt).step
        out["same.params"], out["same.seen"] = train(run, model, opt, iter(loader), STEPS - 2,
                                                     masked=True)
    for name, mesh in (("dp4", {"dp_shard": 4, "tp": 1}), ("tp4r", {"tp": 4})):
        with ss.init(seed=0, mesh=mesh, accumulate=2) as run:
            model = run.model(tiny(), tp_plan=plan())
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            loader = run.loader(Tokens(), GLOBAL // run.dp_size // 2)
            run.resume(root, model=model, optimizer=opt)
            out[f"{name}.loaded"] = full(model)
            out[f"{name}.params"], out[f"{name}.seen"] = train(run, model, opt, iter(loader),
                                                               STEPS - 2, masked=True)
    return out


def more_ranks(rank: int, world: int, root: str) -> dict[str, Any]:
    """The extended phases: a Hugging Face model, bf16-mixed, refusals, the ledger, and one
    process resuming the checkpoint the first spawn wrote."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    for name, mesh in (("rep2tp2", {"dp_replicate": 2, "tp": 2}),  # HSDP's replicas and TP
                       ("rep2shard2", {"dp_replicate": 2, "dp_shard": 2})):
        with ss.init(seed=0, mesh=mesh) as run:
            model = run.model(tiny(), tp_plan=plan())
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            loader = run.loader(Tokens(), GLOBAL // run.dp_size)
            out[name], _ = train(run, model, opt, iter(loader), STEPS)
    with ss.init(seed=0, mesh={"dp_shard": 2, "tp": 2}) as run:
        out["hf"] = hf_steps(run, llama(), GLOBAL // run.dp_size)
    # the sample ledger: 2 steps at (dp 2, tp 2), saved, the rest of the epoch at (dp 4, tp 1)
    # (2 samples per replica in both: the audit vouches for a resumed order at one batch size)
    for mesh, steps in (({"dp_shard": 2, "tp": 2}, 2), ({"dp_shard": 4}, (N - 2 * 4) // 8)):
        with ss.init(seed=0, mesh=mesh, ledger=True, run_dir=root + "-ledger") as run:
            model = run.model(tiny(), tp_plan=plan())
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            loader = run.loader(Tokens(), 2)
            run.resume(root + "-ledger/ckpt", model=model, optimizer=opt)
            train(run, model, opt, iter(loader), steps)
            run.save(root + "-ledger/ckpt")
    with ss.init(seed=0, mesh={"dp_shard": 2, "tp": 2}, precision="bf16-mixed") as run:
        model = run.model(tiny().float(), tp_plan=plan())
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        loader = run.loader(Tokens(), GLOBAL // run.dp_size)
        out["bf16"], _ = train(run, model, opt, iter(loader), STEPS)
    with ss.init(seed=0, mesh={"tp": 4}) as run:
        out["refused"] = []
        for options in ({"compile": True}, {"offload": True}):
            try:
                run.model(tiny(), tp_plan=plan(), **options)
            except ValueError as exc:
                out["refused"].append(str(exc))
    dist.destroy_process_group()
    if rank == 0:  # the same checkpoint, resumed by one process
        env = clean_env()
        os.environ.clear()
        os.environ.update(env)
        with ss.init(seed=0, mesh={"tp": 1}, accumulate=2) as run:
            out["one.who"] = (run.mesh, run.dp_rank, run.dp_size, run.tp_rank, run.tp_size)
            model = run.model(tiny(), tp_plan=plan())
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            loader = run.loader(Tokens(), GLOBAL // 2)
            run.resume(root, model=model, optimizer=opt)
            out["one.loaded"] = full(model)
            out["one.params"], out["one.seen"] = train(run, model, opt, iter(loader),
                                                       STEPS - 2, masked=True)
    return out


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=2 * DIM,
                         num_hidden_layers=2, num_attention_heads=HEADS,
                         num_key_value_heads=HEADS, max_position_embeddings=SEQ)
    return LlamaForCausalLM(config).double()


def hf_steps(run: ss.Run | None, model: nn.Module, batch: int) -> list[torch.Tensor]:
    """Two SGD steps of a Hugging Face causal LM on the first samples; the weights after."""
    if run is not None:
        model = run.model(model, tp_plan="auto")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    start = 0 if run is None else run.dp_rank * batch
    data, out = Tokens(), []
    for s in range(2):
        tokens = torch.stack([data[s * GLOBAL + start + i][0] for i in range(batch)])
        loss = model(input_ids=tokens[:, :-1], labels=tokens[:, :-1]).loss
        run.backward(loss) if run is not None else loss.backward()
        run.step(opt) if run is not None else (opt.step(), opt.zero_grad())
        out.append(full(model))
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tp") / "ckpt"


@pytest.fixture(scope="module")
def ranks(root: Path) -> list[dict[str, Any]]:
    return spawn(tp_ranks, 4, str(root), timeout=500)


@pytest.fixture(scope="module")
def more(ranks: list[dict[str, Any]], root: Path) -> list[dict[str, Any]]:
    return spawn(more_ranks, 4, str(root), timeout=500)


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("name", ["dp2tp2", "tp4"])
def test_tp_trains_like_one_process_on_the_global_batch(ranks: list[dict[str, Any]],
                                                       name: str) -> None:
    want, ema = reference(STEPS)
    for r in ranks:
        assert r[f"{name}.strategy"] == "tp"
        for s in range(STEPS):
            assert close(r[f"{name}.params"][s], want[s]) < 1e-9, (name, s)
        assert close(r[f"{name}.ema"], ema) < 1e-9
    assert close(want[-1], tiny_params()) > 1e-3  # the steps really moved the weights


def tiny_params() -> torch.Tensor:
    return full(tiny())


def test_mesh_coordinates_and_batches_by_replica(ranks: list[dict[str, Any]]) -> None:
    names = ("dp_replicate", "dp_shard", "tp")
    assert [r["dp2tp2.who"] for r in ranks] == [
        (0, 2, 0, 2, names, (1, 2, 2)), (0, 2, 1, 2, names, (1, 2, 2)),
        (1, 2, 0, 2, names, (1, 2, 2)), (1, 2, 1, 2, names, (1, 2, 2))]
    assert [r["tp4.who"] for r in ranks] == [(0, 1, t, 4, names, (1, 1, 4)) for t in range(4)]
    # the ranks of a TP group read the same batch; the replicas share out the global one
    for s in range(STEPS):
        assert ranks[0]["dp2tp2.seen"][s] == ranks[1]["dp2tp2.seen"][s]
        assert ranks[2]["dp2tp2.seen"][s] == ranks[3]["dp2tp2.seen"][s]
        both = ranks[0]["dp2tp2.seen"][s] + ranks[2]["dp2tp2.seen"][s]
        assert sorted(both) == list(range(s * GLOBAL, (s + 1) * GLOBAL))
        assert all(r["tp4.seen"][s] == list(range(s * GLOBAL, (s + 1) * GLOBAL))
                   for r in ranks)


def test_accumulation_count_and_background_save(ranks: list[dict[str, Any]]) -> None:
    want, _ = reference(STEPS, masked=True)
    for r in ranks:
        for s in range(STEPS):
            assert close(r["count.params"][s], want[s]) < 1e-9, s
    # the masked loss differs from the mean: count= really weighed by items
    assert close(reference(STEPS)[0][-1], want[-1]) > 1e-4


def test_resume_at_the_same_mesh_is_bit_equal(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert r["same.step"] == 2
        for a, b in zip(r["same.params"], r["count.params"][2:], strict=True):
            assert torch.equal(a, b)
        assert r["same.seen"] == r["count.seen"][2:]


@pytest.mark.parametrize("name", ["dp4", "tp4r"])
def test_resume_at_another_mesh(ranks: list[dict[str, Any]], name: str) -> None:
    want, _ = reference(STEPS, masked=True)
    for r in ranks:
        assert torch.equal(r[f"{name}.loaded"], ranks[0]["count.params"][1])  # the save
        for s, got in enumerate(r[f"{name}.params"], start=2):
            assert close(got, want[s]) < 1e-9, (name, s)
    # every sample of the run once: before the save (by the 2 replicas), after it (by the new)
    before = [i for r in (ranks[0], ranks[2]) for step in r["count.seen"][:2] for i in step]
    dp = 4 if name == "dp4" else 1
    after = [i for r in ranks[::4 // dp] for step in r[f"{name}.seen"] for i in step]
    assert sorted(before + after) == list(range(STEPS * GLOBAL))


def test_the_clip_binds_in_every_step() -> None:
    """So the equivalence above checks the norm over DTensors on two meshes (and plain ones)."""
    data, model = Tokens(), tiny()
    for s in range(STEPS):
        batch = [data[i] for i in range(s * GLOBAL, (s + 1) * GLOBAL)]
        tokens, idx = torch.stack([b[0] for b in batch]), torch.tensor([b[1] for b in batch])
        loss_of(model, tokens, idx, False)[0].backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        assert norm > 2 * CLIP
        model.zero_grad()


@pytest.mark.extended
def test_one_process_resumes_the_tp_checkpoint(ranks: list[dict[str, Any]],
                                              more: list[dict[str, Any]]) -> None:
    want, _ = reference(STEPS, masked=True)
    one = {**ranks[0], **more[0]}
    assert one["one.who"] == (None, 0, 1, 0, 1)
    assert torch.equal(one["one.loaded"], one["count.params"][1])
    for s, got in enumerate(one["one.params"], start=2):
        assert close(got, want[s]) < 1e-9, s
    before = [i for r in (ranks[0], ranks[2]) for step in r["count.seen"][:2] for i in step]
    after = [i for step in one["one.seen"] for i in step]  # (one["one.*"]: from more)
    assert sorted(before + after) == list(range(STEPS * GLOBAL))


@pytest.mark.extended
def test_a_hugging_face_causal_lm_runs_with_the_auto_plan(more: list[dict[str, Any]]) -> None:
    want = hf_steps(None, llama(), GLOBAL)
    for r in more:
        for s in range(2):
            assert close(r["hf"][s], want[s]) < 1e-9, s


def test_ckpt_convert_writes_one_file_from_a_tp_checkpoint(ranks: list[dict[str, Any]],
                                                          root: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from splitsync.cli import main as cli

    out = tmp_path / "tiny.safetensors"
    assert cli(["ckpt", "convert", str(root), str(out)]) == 0
    model = tiny()
    model.load_state_dict(load_file(str(out)))
    assert torch.equal(full(model), ranks[0]["count.params"][1])  # the step-2 save


@pytest.mark.extended
def test_bf16_mixed_trains_close_to_float32(more: list[dict[str, Any]]) -> None:
    want, _ = reference(STEPS, dtype=torch.float32)
    moved = close(want[-1], full(tiny()).float())  # how far float32 training went
    for r in more:
        assert r["bf16"][-1].dtype == torch.float32  # the weights stay float32
        # bf16 compute keeps ~3 significant digits: well within the distance trained
        assert close(r["bf16"][-1], want[-1]) < moved / 5, (close(r["bf16"][-1], want[-1]),
                                                            moved)


@pytest.mark.extended
def test_what_a_tp_model_refuses(more: list[dict[str, Any]]) -> None:
    compile_, offload = more[0]["refused"]
    assert "compile=" in compile_ and "not supported yet" in compile_
    assert "offload=" in offload and "one replica" in offload


@pytest.mark.extended
def test_the_ledger_counts_samples_per_replica(more: list[dict[str, Any]], root: Path) -> None:
    from splitsync.tools.audit.audit import audit

    report = audit(str(root) + "-ledger")
    assert report.ok, report.findings
    assert [(e.epoch, e.samples, e.once, e.more, e.never, e.status) for e in report.epochs] == [
        (0, N, N, 0, 0, "exactly once")]


@pytest.mark.extended
@pytest.mark.parametrize("name", ["rep2tp2", "rep2shard2"])
def test_replicas_with_tp_and_with_shards_train_like_one_process(more: list[dict[str, Any]],
                                                                 name: str) -> None:
    want, _ = reference(STEPS)
    for r in more:
        for s in range(STEPS):
            assert close(r[name][s], want[s]) < 1e-9, (name, s)
