"""GPU-only core paths: device per local rank, NCCL group with device_id, pinned copies,
CUDA RNG in checkpoints. Skipped without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.distributed.device import choose_device, move_to
from splitsync.distributed.env import DistEnv, EnvError

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
pytestmark = [pytest.mark.skipif(not CUDA, reason="needs CUDA"), pytest.mark.timeout(240)]


def test_device_follows_local_rank_and_rejects_missing_gpus() -> None:
    env = DistEnv(launcher="torchrun", rank=0, local_rank=GPUS - 1, world_size=GPUS,
                  local_world_size=GPUS)
    assert choose_device(env) == torch.device("cuda", GPUS - 1)
    too_far = DistEnv(launcher="torchrun", rank=GPUS, local_rank=GPUS, world_size=GPUS + 1,
                      local_world_size=GPUS + 1)
    with pytest.raises(EnvError, match=f"LOCAL_RANK={GPUS} but only {GPUS} cuda"):
        choose_device(too_far)


def test_pinned_batches_are_copied_asynchronously_and_arrive_intact() -> None:
    cpu = {"x": torch.arange(1024.0).pin_memory(), "y": [torch.ones(3)]}
    out = move_to(cpu, "cuda")
    torch.cuda.synchronize()
    assert out["x"].is_cuda and torch.equal(out["x"].cpu(), cpu["x"])
    assert out["y"][0].is_cuda


def test_nccl_group_of_one_with_device_id(monkeypatch: pytest.MonkeyPatch) -> None:
    from splitsync.distributed.group import free_port

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    with ss.init(seed=0, strategy="ddp") as run:
        assert (run.backend, run.device) == ("nccl", torch.device("cuda", 0))
        model = run.model(nn.Linear(4, 2))
        assert model.device_ids == [0]
        loader = run.loader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
        batch = next(iter(loader))[0]
        assert batch.is_cuda
        assert run.mean(torch.tensor(3.0)).item() == 3.0
    assert not torch.distributed.is_initialized()
    assert os.environ["RANK"] == "0"


def test_cuda_rng_state_survives_resume(tmp_path: Path) -> None:
    with ss.init(seed=0, device="cuda") as run:
        model = run.model(nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(tmp_path, model=model, optimizer=opt)
        run.save(tmp_path, step=1)
        expected = torch.rand(4, device="cuda")
    with ss.init(seed=123, device="cuda") as run:
        model = run.model(nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = run.resume(tmp_path, model=model, optimizer=opt)
        assert state.resumed
        assert torch.equal(torch.rand(4, device="cuda"), expected)
