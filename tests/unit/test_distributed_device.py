"""Device choice, backend mapping and move_to over nested batches."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass

import pytest
import torch

from splitsync.distributed.device import choose_device, default_backend, move_to
from splitsync.distributed.env import DistEnv, EnvError


def test_cpu_without_accelerators_and_explicit_override() -> None:
    env = DistEnv(launcher="none")
    if not torch.cuda.is_available():
        assert choose_device(env).type == "cpu"
    assert choose_device(env, "cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_requesting_missing_cuda_is_a_clear_error() -> None:
    with pytest.raises(EnvError, match="no cuda device is visible"):
        choose_device(DistEnv(launcher="none"), "cuda")


def test_local_rank_beyond_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("splitsync.distributed.device.visible_device_count", lambda kind: 2)
    env = DistEnv(launcher="torchrun", rank=3, local_rank=3, world_size=4, local_world_size=4)
    with pytest.raises(EnvError, match="LOCAL_RANK=3 but only 2 cuda device"):
        choose_device(env, "cuda")


def test_backends() -> None:
    assert default_backend(torch.device("cpu")) == "gloo"
    assert default_backend(torch.device("cuda", 0)) == "nccl"
    assert default_backend(torch.device("xpu", 0)) == "xccl"


Pair = namedtuple("Pair", "x y")


@dataclass(frozen=True)
class Batch:
    image: torch.Tensor
    label: torch.Tensor
    name: str


def test_move_to_nested_structures_keeps_types() -> None:
    t = torch.ones(2, dtype=torch.float64)
    batch = {
        "pair": Pair(t, [t, (t, 3)]),
        "ordered": OrderedDict(a=t),
        "data": Batch(t, t, "n"),
        "text": "keep",
    }
    out = move_to(batch, torch.device("meta"))
    assert isinstance(out["pair"], Pair) and out["pair"].x.device.type == "meta"
    assert out["pair"].y[1][0].device.type == "meta" and out["pair"].y[1][1] == 3
    assert isinstance(out["ordered"], OrderedDict) and out["ordered"]["a"].is_meta
    assert isinstance(out["data"], Batch) and out["data"].label.is_meta
    assert out["data"].name == "n" and out["text"] == "keep"
    assert t.device.type == "cpu"  # the source is untouched


def test_move_to_same_device_returns_same_tensor() -> None:
    t = torch.ones(3)
    assert move_to([t], "cpu")[0] is t
