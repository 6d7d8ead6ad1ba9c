"""FSDP2 checkpoints through torch.distributed.checkpoint: 2 ranks -> 1 rank -> 2 ranks."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt.store import read_manifest, write_manifest
from splitsync.errors import CheckpointError
from splitsync.testing import spawn


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _full_params(model: nn.Module) -> dict[str, np.ndarray]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.detach().cpu().numpy().copy() for k, v in sd.items()}


def _train(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    g = torch.Generator().manual_seed(run.rank)
    for _ in range(steps):
        run.backward(model(torch.randn(4, 8, generator=g)).pow(2).mean())
        run.step(opt)


def sharded(rank: int, world: int, root: str, steps: int, export: str) -> dict:
    from torch.distributed.fsdp import fully_shard

    with ss.init(seed=0) as run:
        model = _net()
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        state = run.resume(root, model=model, optimizer=opt)
        loaded = _full_params(model)
        _train(run, model, opt, steps)
        if steps:
            run.save(root)
        run.export(export)
        return {"step": state.step, "loaded": loaded, "final": _full_params(model)}


def single(rank: int, world: int, root: str, steps: int) -> dict:
    with ss.init(seed=0) as run:
        model = run.model(_net(), strategy="single")
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        state = run.resume(root, model=model, optimizer=opt)
        loaded = _full_params(model)
        adam_step = opt.state_dict()["state"][0]["step"].item()
        _train(run, model, opt, steps)
        run.save(root)
        return {"step": state.step, "loaded": loaded, "final": _full_params(model),
                "adam_step": adam_step}


class _Payload:
    def __init__(self, sentinel: str) -> None:
        self.sentinel = sentinel

    def __reduce__(self):  # what a forged checkpoint would run when unpickled
        return (open, (self.sentinel, "w"))


def _equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_fsdp_checkpoint_changes_world_size(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    root = str(tmp_path / "ck")
    two = spawn(sharded, 2, root, 2, str(tmp_path / "a.safetensors"), timeout=90)[0]
    assert (tmp_path / "ck" / "step-000002" / "dcp" / ".metadata").is_file()
    exported = load_file(tmp_path / "a.safetensors")
    assert _equal({k: v.numpy() for k, v in exported.items()}, two["final"])

    one = single(0, 1, root, 1)  # 2 ranks -> 1 rank (no process group needed: run it here)
    assert (one["step"], one["adam_step"]) == (2, 2)
    assert _equal(one["loaded"], two["final"])
    assert not _equal(one["final"], two["final"])  # it trained on

    back = spawn(sharded, 2, root, 0, str(tmp_path / "b.safetensors"), timeout=90)[0]
    assert back["step"] == 3  # 1 rank -> 2 ranks, from an unsharded checkpoint
    assert _equal(back["loaded"], one["final"])

    # A forged DCP checkpoint: its .metadata is a pickle that would create a file.
    evil = tmp_path / "evil"
    shutil.copytree(tmp_path / "ck" / "step-000002", evil / "step-000002")
    sentinel = tmp_path / "pwned"
    (evil / "step-000002" / "dcp" / ".metadata").write_bytes(
        pickle.dumps(_Payload(str(sentinel))))
    body = read_manifest(evil / "step-000002")
    (evil / "step-000002" / "manifest.json").unlink()
    write_manifest(evil / "step-000002",
                   {k: v for k, v in body.items() if k not in ("files", "format")})
    with ss.init(seed=0) as run:
        model = run.model(_net(), strategy="single")
        with pytest.raises(CheckpointError, match="refused"):
            run.resume(evil, model=model)
    assert not sentinel.exists()
