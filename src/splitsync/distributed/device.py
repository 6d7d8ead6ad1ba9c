"""Choose this rank's device and backend; move nested batches to it."""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from splitsync.distributed.env import DistEnv, EnvError

__all__ = ["choose_device", "default_backend", "move_to", "visible_device_count"]

T = TypeVar("T")
_BACKENDS = {"cuda": "nccl", "cpu": "gloo", "xpu": "xccl", "mps": "gloo"}


def visible_device_count(kind: str) -> int:
    """Number of accelerators of ``kind`` this process can see (0 for cpu)."""
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "xpu":
        xpu = getattr(torch, "xpu", None)
        return xpu.device_count() if xpu is not None and xpu.is_available() else 0
    if kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        return 1 if mps is not None and mps.is_available() else 0
    return 0


def _auto_kind() -> str:
    for kind in ("cuda", "xpu", "mps"):
        if visible_device_count(kind) > 0:
            return kind
    return "cpu"


def choose_device(env: DistEnv, requested: str | torch.device | None = None) -> torch.device:
    """The device for this rank: cuda:LOCAL_RANK (or xpu, mps) when present, else cpu.

    ``requested`` may be a kind ("cpu", "cuda") or a full device ("cuda:1").
    """
    if requested is not None:
        dev = torch.device(requested)
        if dev.type == "cpu" or dev.index is not None:
            return dev
        kind = dev.type
    else:
        kind = _auto_kind()
    if kind == "cpu":
        return torch.device("cpu")
    count = visible_device_count(kind)
    if count == 0:
        raise EnvError(
            f"device={kind!r} was requested but no {kind} device is visible. "
            "Use init(device='cpu') or check the driver."
        )
    if kind == "mps":
        return torch.device("mps")
    if env.local_rank >= count:
        raise EnvError(
            f"LOCAL_RANK={env.local_rank} but only {count} {kind} device(s) are visible. "
            f"Launch at most {count} processes per node (`splitsync run -n {count}`) "
            "or check CUDA_VISIBLE_DEVICES."
        )
    return torch.device(kind, env.local_rank)


def default_backend(device: torch.device) -> str:
    """nccl for cuda, xccl for xpu, gloo otherwise."""
    return _BACKENDS.get(device.type, "gloo")


def move_to(obj: T, device: torch.device | str, non_blocking: bool | None = None) -> T:
    """Move every tensor inside nested dicts, lists, tuples, namedtuples and dataclasses.

    Copies are asynchronous when the source tensor is pinned (safe: the copy is ordered
    on the device stream before any kernel that reads it).
    """
    device = torch.device(device)
    return _move(obj, device, non_blocking)


def _move(obj: Any, device: torch.device, non_blocking: bool | None) -> Any:
    from splitsync.tree import map_tensors

    def move(t: torch.Tensor) -> torch.Tensor:
        if t.device == device:
            return t
        nb = t.is_pinned() if non_blocking is None else non_blocking
        return t.to(device, non_blocking=nb)

    return map_tensors(move, obj)
