"""Uneven inputs: ranks that run out of batches early shadow the others' collectives."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from torch import nn
from torch.distributed.algorithms.join import Join, Joinable
from torch.nn.parallel import DistributedDataParallel

__all__ = ["join"]


def join(*objects: nn.Module | Joinable, enable: bool = True,
         throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
    """``torch.distributed.algorithms.Join`` over DDP models (and other Joinables).

    A single-process model needs no joining and gets a no-op context. FSDP has no join
    support in PyTorch: give every rank the same number of batches instead
    (``run.loader(..., drop_last=True)``).
    """
    joinables = []
    for obj in objects:
        if isinstance(obj, (DistributedDataParallel, Joinable)):
            joinables.append(obj)
        elif _is_fsdp(obj):
            raise ValueError(
                "run.join() works with DDP models; FSDP has no uneven-input support in "
                "PyTorch. Give every rank the same number of batches instead, e.g. "
                "run.loader(data, batch_size, drop_last=True)."
            )
        elif not isinstance(obj, nn.Module):
            raise TypeError(f"run.join() takes models (or Joinables), got {type(obj).__name__}.")
    if not joinables or not enable:
        return nullcontext()
    return Join(joinables, enable=enable, throw_on_early_termination=throw_on_early_termination)


def _is_fsdp(obj: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(obj, FSDPModule)
