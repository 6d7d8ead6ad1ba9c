"""The run's collectives part: no-ops at world size 1, reported to observers around each call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from splitsync.distributed import comm
from splitsync.observe import Observer, chain_around
from splitsync.run.data import Loaders

__all__ = ["Collectives"]


def _direct(op: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Collectives:
    """mean/sum/max/gather/broadcast/barrier and exact metric gathering."""

    def __init__(self, device: torch.device, loaders: Loaders) -> None:
        self.device = device
        self.loaders = loaders
        # call(op, fn, *args): chosen when observers change (an observer may watch for hangs)
        self.call: Callable[..., Any] = _direct

    def set_observers(self, observers: Sequence[Observer]) -> None:
        self.call = chain_around(observers) or _direct

    def mean(self, x: Any) -> Any:
        return self.call("all_reduce", comm.reduce, x, "mean", self.device)

    def sum(self, x: Any) -> Any:
        return self.call("all_reduce", comm.reduce, x, "sum", self.device)

    def max(self, x: Any) -> Any:
        return self.call("all_reduce", comm.reduce, x, "max", self.device)

    def gather(self, x: Any) -> torch.Tensor:
        return self.call("all_gather", comm.all_gather, x, self.device)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.call("broadcast", comm.broadcast_object, obj, src)

    def barrier(self) -> None:
        # an observer may run its own barrier instead (the hang guard's monitored one)
        self.call("barrier", comm.barrier)

    def gather_for_metrics(self, x: torch.Tensor) -> torch.Tensor:
        active = self.loaders.active
        if active is not None:
            x = active.trim_padding(x)
        return self.call("all_gather", comm.all_gather, x, self.device)
