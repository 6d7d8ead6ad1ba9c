"""Uneven inputs: ranks that run out of batches early shadow the others' collectives."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from torch import nn
from torch.distributed.algorithms.join import Join, Joinable

from splitsync.strategies import for_model

__all__ = ["join"]


def join(*objects: nn.Module | Joinable, enable: bool = True,
         throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
    """``torch.distributed.algorithms.Join`` over the models' joinables (DDP) and Joinables.

    Each model's strategy says what to join: a single-process model needs nothing (a no-op
    context); FSDP has no join support in PyTorch and raises with the fix (give every rank
    the same number of batches, ``run.loader(..., drop_last=True)``).
    """
    joinables: list[Any] = []
    for obj in objects:
        if isinstance(obj, Joinable):
            joinables.append(obj)
        elif isinstance(obj, nn.Module):
            joinables.extend(for_model(obj).joinables(obj))
        else:
            raise TypeError(f"run.join() takes models (or Joinables), got {type(obj).__name__}.")
    if not joinables or not enable:
        return nullcontext()
    return Join(joinables, enable=enable, throw_on_early_termination=throw_on_early_termination)
