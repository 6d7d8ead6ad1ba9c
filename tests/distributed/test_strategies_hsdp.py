"""HSDP on 4 CPU ranks, offload and activation checkpointing on 2, checkpoints across sizes.

One spawn of 4 processes serves every check. The 4 ranks train HSDP (2 replicas x 2
shards: plain, accumulate=2, offload) and save a checkpoint; then they tear their group
down and ranks 0 and 1 form a new 2-rank group, which resumes that checkpoint under FSDP
and trains with activation checkpointing under DDP and FSDP and with FSDP offload. Each
group is formed once and shared by the successive runs in it.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.testing import spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

STEPS, BATCH = 5, 16  # optimizer steps; global batch


class Block(nn.Module):
    def __init__(self, d: int = 8, p: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(torch.tanh(self.fc1(x))))


def net(p: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), Block(p=p), Block(p=p), nn.Linear(8, 2))


def data(steps: int = STEPS + 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(steps, BATCH, 6, generator=g) * 2, torch.randn(steps, BATCH, 2, generator=g)


def full(model: nn.Module) -> torch.Tensor:
    parts = []
    for p in model.parameters():
        t = p.detach()
        whole = getattr(t, "full_tensor", None)
        parts.append((whole() if whole is not None else t).flatten())
    return torch.cat(parts)


def reference(steps: int) -> list[torch.Tensor]:
    """One process, the whole global batch per step: the parameters after each step."""
    x, y = data()
    model = net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    out = []
    for s in range(steps):
        nn.functional.mse_loss(model(x[s]), y[s]).backward()
        opt.step()
        opt.zero_grad()
        out.append(full(model))
    return out


def train(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer, steps: range,
          accumulate: int = 1) -> None:
    """Each rank its slice of every global batch, split into ``accumulate`` micro-batches."""
    x, y = data()
    micro = BATCH // run.world_size // accumulate
    for s in steps:
        for m in range(accumulate):
            at = (m * run.world_size + run.rank) * micro
            run.backward(nn.functional.mse_loss(model(x[s, at:at + micro]),
                                                y[s, at:at + micro]))
            run.step(opt)


class Notes(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class CollectiveCount:
    """Counts FSDP2's gradient reduce-scatters and all-reduces (the real calls, passed on)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist, self.counts = dist, {"reduce_scatter": 0, "all_reduce": 0}
        self.saved = (dist.reduce_scatter_single, dist.all_reduce)

        def counted(name: str, fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                self.counts[name] += 1
                return fn(*args, **kwargs)
            return call

        dist.reduce_scatter_single = counted("reduce_scatter", self.saved[0])
        dist.all_reduce = counted("all_reduce", self.saved[1])

    def close(self) -> dict[str, int]:
        self.dist.reduce_scatter_single, self.dist.all_reduce = self.saved
        return dict(self.counts)


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.02)


def group_rank(rank: int, world: int, root: str) -> dict[str, Any]:
    """4 ranks of HSDP; then ranks 0 and 1 as a 2-rank world of their own."""
    import os

    import torch.distributed as dist

    from splitsync.distributed.ports import free_port

    dist.init_process_group("gloo")  # each ss.init below finds it and leaves it up
    out = {"four": hsdp_phase(rank, world, root)}
    port = [free_port() if rank == 0 else 0]
    dist.broadcast_object_list(port)
    dist.destroy_process_group()
    if rank >= 2:
        return out
    os.environ.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_PORT=str(port[0]))
    dist.init_process_group("gloo")
    out["two"] = two_phase(rank, 2, root)
    return out


def hsdp_phase(rank: int, world: int, root: str) -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule

    from splitsync.strategies import for_model

    out: dict[str, Any] = {}
    notes = Notes()
    logging.getLogger("splitsync").addHandler(notes)
    with ss.init(seed=0, strategy="hsdp") as run:
        model = run.model(net(), replicate=2)
        opt = _adamw(model)
        run.resume(root, model=model, optimizer=opt)  # nothing there yet: a fresh start
        w = model[0].weight
        out["placements"] = [type(p).__name__ for p in w.placements]
        out["mesh"] = dict(zip(w.device_mesh.mesh_dim_names, w.device_mesh.shape, strict=True))
        out["local_fraction"] = (sum(p.to_local().numel() for p in model.parameters())
                                 / sum(p.numel() for p in model.parameters()))
        out["sharded"] = sum(isinstance(m, FSDPModule) for m in model.modules())
        out["strategy"] = (run.strategy_of(model).name, for_model(model).name)
        train(run, model, opt, range(STEPS))
        run.save(root, blocking=False)  # staged by local shards, written in the background
        run.export(root + ".safetensors")  # gathered whole from the 2-D mesh
        out["plain"] = full(model)

        off = run.model(net(), replicate=2, offload=True)
        off_opt = _adamw(off)
        train(run, off, off_opt, range(STEPS))
        out["offload"] = full(off)
        out["offload_notes"] = sum("nothing to offload" in m for m in notes.messages)
    with ss.init(seed=0, strategy="hsdp", accumulate=2) as run:
        model = run.model(net(), shard=2)
        opt = _adamw(model)
        x, y = data()
        counter = CollectiveCount()  # a micro-step that does not step: no gradient traffic
        run.backward(nn.functional.mse_loss(model(x[0, rank * 2:rank * 2 + 2]),
                                            y[0, rank * 2:rank * 2 + 2]))
        out["skipped_micro"] = counter.close()
        counter = CollectiveCount()
        at = (world + rank) * 2
        run.backward(nn.functional.mse_loss(model(x[0, at:at + 2]), y[0, at:at + 2]))
        out["stepping_micro"] = counter.close()
        run.step(opt)
        train(run, model, opt, range(1, STEPS), accumulate=2)
        out["accumulate"] = full(model)
    logging.getLogger("splitsync").removeHandler(notes)
    return out


def two_phase(rank: int, world: int, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with ss.init(seed=0, strategy="fsdp") as run:
        model = run.model(net())
        opt = _adamw(model)
        state = run.resume(root, model=model, optimizer=opt)  # the 4-rank HSDP checkpoint
        out["step"] = state.step
        out["loaded"] = full(model)
        train(run, model, opt, range(STEPS, STEPS + 1))
        out["resumed"] = full(model)

        runs = {"ddp": {"strategy": "ddp"}, "fsdp": {"strategy": "fsdp"},
                "ddp-ckpt": {"strategy": "ddp", "activation_checkpointing": True},
                "fsdp-ckpt": {"strategy": "fsdp", "activation_checkpointing": Block},
                "fsdp-offload": {"strategy": "fsdp", "offload": True}}
        for name, kwargs in runs.items():
            m = run.model(net(p=0.2), **kwargs)  # dropout: recomputation must replay the RNG
            train(run, m, _adamw(m), range(STEPS))
            out[name] = full(m)
        m = run.model(net(), activation_checkpointing=Block, compile={"backend": "eager"})
        train(run, m, _adamw(m), range(2))
        out["fsdp-ckpt-compiled"] = full(m)
        m = run.model(net())
        train(run, m, _adamw(m), range(2))
        out["fsdp-2"] = full(m)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("hsdp") / "ck")
    ranks = spawn(group_rank, 4, root, timeout=300)
    return {"four": [r["four"] for r in ranks], "two": [r["two"] for r in ranks[:2]],
            "root": root, "ref": reference(STEPS + 1)}


def test_hsdp_matches_one_process_with_half_the_parameters_per_rank(runs: dict) -> None:
    ref = runs["ref"][STEPS - 1]
    for res in runs["four"]:
        assert res["placements"] == ["Replicate", "Shard"]
        assert res["mesh"] == {"replicate": 2, "shard": 2}
        assert res["local_fraction"] == 0.5  # every dim 0 here is even: no padding
        assert res["sharded"] == 3  # two blocks and the root
        assert res["strategy"] == ("hsdp", "hsdp")
        assert (res["plain"] - ref).abs().max().item() < 1e-5
    from safetensors.torch import load_file

    exported = load_file(runs["root"] + ".safetensors")
    assert torch.equal(torch.cat([exported[k].flatten() for k in net().state_dict()]),
                       runs["four"][0]["plain"])


def test_hsdp_accumulation_skips_reduce_scatter_and_all_reduce(runs: dict) -> None:
    ref = runs["ref"][STEPS - 1]
    for res in runs["four"]:
        assert res["skipped_micro"] == {"reduce_scatter": 0, "all_reduce": 0}
        assert res["stepping_micro"]["reduce_scatter"] == 3  # one per sharded module
        assert res["stepping_micro"]["all_reduce"] == 3  # across the 2 replicas
        assert (res["accumulate"] - ref).abs().max().item() < 1e-5


def test_offload_on_cpu_trains_like_plain_sharding_and_says_so_once(runs: dict) -> None:
    for res in runs["four"]:
        assert (res["offload"] - res["plain"]).abs().max().item() < 1e-5
    assert [res["offload_notes"] for res in runs["four"]] == [1, 0, 0, 0]  # rank 0, once
    for res in runs["two"]:
        assert (res["fsdp-offload"] - res["fsdp"]).abs().max().item() < 1e-5


def test_hsdp_checkpoint_resumes_under_fsdp_at_two_ranks_and_at_one(runs: dict) -> None:
    ref = runs["ref"]
    for res in runs["two"]:
        assert res["step"] == STEPS
        assert torch.equal(res["loaded"], runs["four"][0]["plain"])
        # optimizer state came along: the next step matches the uninterrupted reference
        assert (res["resumed"] - ref[STEPS]).abs().max().item() < 1e-5
    with ss.init(seed=0) as run:
        model = run.model(net(), strategy="single")
        opt = _adamw(model)
        state = run.resume(runs["root"], model=model, optimizer=opt)
        assert state.step == STEPS
        assert torch.equal(full(model), runs["four"][0]["plain"])
        train(run, model, opt, range(STEPS, STEPS + 1))
        assert (full(model) - ref[STEPS]).abs().max().item() < 1e-5


def test_activation_checkpointing_trains_identically_under_ddp_and_fsdp(runs: dict) -> None:
    for res in runs["two"]:
        assert (res["ddp-ckpt"] - res["ddp"]).abs().max().item() <= 1e-6
        assert (res["fsdp-ckpt"] - res["fsdp"]).abs().max().item() <= 1e-6
        assert (res["fsdp-ckpt-compiled"] - res["fsdp-2"]).abs().max().item() <= 1e-6
        assert (res["fsdp"] - res["ddp"]).abs().max().item() < 1e-5  # same run, two ways
