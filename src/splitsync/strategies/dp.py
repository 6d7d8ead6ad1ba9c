"""Legacy ``nn.DataParallel``: one process drives every visible GPU.

Each forward scatters the batch along dim 0 over the GPUs, replicates the module and
gathers outputs on GPU 0. Simple, but slower than DDP (one Python thread per GPU, the
replication every step, GPU 0 doing extra work), so a note recommends DDP once per process.
Its classic traps get clear errors here: a tensor without a batch dimension, or a batch
smaller than the number of GPUs. With fewer than two GPUs it falls back to one device.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel

from splitsync.distributed.device import visible_device_count
from splitsync.errors import DataParallelWarning
from splitsync.strategies.base import Strategy, WrapContext
from splitsync.train.actckpt import has_bound_forwards, rebind_forwards

OPTIONS = ("device_ids",)

DDP_NOTE = (
    "strategy='dp' (nn.DataParallel) runs every GPU from one process and is slower than DDP. "
    "Prefer `splitsync run -n {n} script.py` with strategy='ddp' (the default there)."
)


def check_batch(inputs: Any, n_devices: int, where: str = "input") -> None:
    """Every tensor in a nested batch needs a batch dimension of at least ``n_devices``."""
    from splitsync.tree import iter_tensors

    for name, t in iter_tensors(inputs, where):
        if t.dim() == 0:
            raise ValueError(
                f"strategy='dp': {name} is a tensor without a batch dimension (shape ()). "
                "DataParallel splits inputs along dim 0; add one, e.g. x.unsqueeze(0), or "
                "pass scalars as Python numbers."
            )
        if t.shape[0] < n_devices:
            raise ValueError(
                f"strategy='dp': {name} has batch size {t.shape[0]} (shape "
                f"{tuple(t.shape)}) but DataParallel splits it over {n_devices} GPUs. "
                f"Use a batch of at least {n_devices} (drop_last=True avoids a short last batch)."
            )


class CheckedDataParallel(DataParallel):
    """DataParallel that checks the batch can be split before scattering it, and whose
    replicas run their own checkpointed forwards."""

    def __init__(self, module: nn.Module, **kwargs: Any) -> None:
        super().__init__(module, **kwargs)
        self._rebind = has_bound_forwards(module)  # activation checkpointing, say

    def replicate(self, module: nn.Module, device_ids: Any) -> Any:
        replicas = super().replicate(module, device_ids)
        if self._rebind:
            for replica in replicas:
                rebind_forwards(module, replica)
        return replicas

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        check_batch(inputs, len(self.device_ids), "input")
        check_batch(kwargs, len(self.device_ids), "input")
        return super().forward(*inputs, **kwargs)


def _wrap(module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
    if ctx.world_size > 1:
        raise ValueError(
            f"strategy='dp' is single-process but this run has {ctx.world_size} processes. "
            "Use strategy='ddp' (or 'auto') with `splitsync run -n N`."
        )
    device_ids = options.get("device_ids")
    count = visible_device_count("cuda")
    if device_ids is None:
        device_ids = list(range(count))
    if ctx.device.type != "cuda" or len(device_ids) < 2:
        warnings.warn(
            f"strategy='dp' needs at least 2 CUDA GPUs; {count} visible on this machine "
            f"(device {ctx.device}). Falling back to a single device.",
            DataParallelWarning, stacklevel=3,
        )
        return module.to(ctx.device)
    warnings.warn(DDP_NOTE.format(n=len(device_ids)), DataParallelWarning, stacklevel=3)
    module = module.to(torch.device("cuda", device_ids[0]))
    return CheckedDataParallel(module, device_ids=device_ids)


class DP(Strategy):
    """nn.DataParallel over the visible GPUs of one process."""

    name = "dp"
    options = OPTIONS
    places_module = True  # DataParallel places replicas itself, from device 0

    def owns(self, model: nn.Module) -> bool:
        return isinstance(model, DataParallel)

    def wrap(self, module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
        return _wrap(module, ctx, options)

    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> nn.Module:
        raise ValueError(
            "run.model(..., compile=True) does not work with strategy='dp' (DataParallel "
            "re-replicates the module every step). Use strategy='ddp' to compile."
        )


STRATEGY = DP()
