"""The run's collectives part: no-ops at world size 1, reported to observers around each call.

:class:`Collectives` is the part; :class:`CollectiveVerbs` is the family of ``run.*`` verbs
the :class:`~splitsync.run.runtime.Run` inherits from it (``run.mean``, ..., ``run.barrier``,
``run.main_process_first``). Every verb is a collective: every rank must call it, in the
same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from splitsync.distributed import comm
from splitsync.observe import Observer, chain_around
from splitsync.run.data import Loaders
from splitsync.train.syncbn import batchnorm_stats

__all__ = ["Collectives", "CollectiveVerbs"]


def _direct(op: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class Collectives:
    """mean/sum/max/min/gather/broadcast/barrier and exact metric gathering."""

    def __init__(self, device: torch.device, loaders: Loaders) -> None:
        self.device = device
        self.loaders = loaders
        # call(op, fn, *args): chosen when observers change (an observer may watch for hangs)
        self.call: Callable[..., Any] = _direct

    def set_observers(self, observers: Sequence[Observer]) -> None:
        self.call = chain_around(observers) or _direct

    def reduce(self, x: Any, op: str) -> Any:
        return self.call("all_reduce", comm.reduce, x, op, self.device)

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


class CollectiveVerbs:
    """``run.mean/sum/max/min/gather/broadcast/barrier/gather_for_metrics`` and
    ``run.main_process_first``: the Run's collective verbs (a mixin over its part)."""

    _collectives: Collectives
    is_main: bool
    local_rank: int

    def mean(self, x: Any) -> Any:
        """Average over ranks (a tensor, or a number: returns a float). Collective."""
        return self._collectives.reduce(x, "mean")

    def sum(self, x: Any) -> Any:
        """Sum over ranks. Collective."""
        return self._collectives.reduce(x, "sum")

    @torch.no_grad()
    def sync_batchnorm_stats(self, model: nn.Module) -> nn.Module:
        """Collective: replace every BatchNorm running mean and variance in ``model`` (the
        model, an EMA, any module) by its mean over the ranks, as timm's ``distribute_bn``
        does, so that every rank evaluates with the same statistics. Returns ``model``.
        Call it on every rank, before evaluating; a model without BatchNorm is left as is."""
        stats = batchnorm_stats(model)
        if not stats:
            return model
        flat = torch.cat([t.detach().reshape(-1).double() for t in stats])
        mean = self._collectives.reduce(flat, "mean").to(flat.device)
        offset = 0
        for t in stats:
            n = t.numel()
            t.copy_(mean[offset:offset + n].view_as(t).to(t.dtype))
            offset += n
        return model

    def max(self, x: Any) -> Any:
        """Maximum over ranks. Collective."""
        return self._collectives.reduce(x, "max")

    def min(self, x: Any) -> Any:
        """Minimum over ranks. Collective."""
        return self._collectives.reduce(x, "min")

    def gather(self, x: Any) -> torch.Tensor:
        """Concatenate along dim 0 from all ranks, in rank order (sizes may differ)."""
        return self._collectives.gather(x)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s object (anything picklable) on every rank."""
        return self._collectives.broadcast(obj, src)

    def barrier(self) -> None:
        """Wait for every rank (with guards: a monitored barrier that names absent ranks)."""
        self._collectives.barrier()

    def gather_for_metrics(self, x: torch.Tensor) -> torch.Tensor:
        """Gather results of the current batch without the sampler's padded duplicates."""
        return self._collectives.gather_for_metrics(x)

    @contextmanager
    def main_process_first(self, *, local: bool = False) -> Iterator[None]:
        """Run the block on rank 0 first (``local=True``: on each node's local rank 0
        first), then on the other ranks: the first fills a cache (a ``datasets`` map, a
        download) that the others then read. Two barriers; collective. If the first rank
        fails inside the block, the others stay at the barrier until the hang guard (or the
        process group's timeout) names it."""
        first = self.local_rank == 0 if local else self.is_main
        if not first:
            self._collectives.barrier()
        yield
        if first:
            self._collectives.barrier()
