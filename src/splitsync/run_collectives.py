"""Run methods for collectives: no-ops at world size 1, watched by the hang guard."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from splitsync import comm

if TYPE_CHECKING:
    from splitsync.data import DeviceLoader
    from splitsync.guards.hangs import Watch

__all__ = ["CollectiveMethods"]


class CollectiveMethods:
    """mean/sum/max/gather/broadcast/barrier and exact metric gathering."""

    device: torch.device
    _watch: Watch | None
    _active: DeviceLoader | None

    def _collective(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        # The hang guard only counts calls; it acts when one fails.
        return fn(*args) if self._watch is None else self._watch.call(op, fn, *args)

    def mean(self, x: Any) -> Any:
        """Average over ranks (tensor or number)."""
        return self._collective("all_reduce", comm.reduce, x, "mean", self.device)

    def sum(self, x: Any) -> Any:
        """Sum over ranks."""
        return self._collective("all_reduce", comm.reduce, x, "sum", self.device)

    def max(self, x: Any) -> Any:
        """Maximum over ranks."""
        return self._collective("all_reduce", comm.reduce, x, "max", self.device)

    def gather(self, x: Any) -> torch.Tensor:
        """Concatenate along dim 0 from all ranks, in rank order."""
        return self._collective("all_gather", comm.all_gather, x, self.device)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s object on every rank."""
        return self._collective("broadcast", comm.broadcast_object, obj, src)

    def barrier(self) -> None:
        """Wait for every rank (with guards: a monitored barrier that names absent ranks)."""
        if self._watch is not None:
            self._watch.barrier()
        else:
            comm.barrier()

    def gather_for_metrics(self, x: torch.Tensor) -> torch.Tensor:
        """Gather results of the current batch without the sampler's padded duplicates."""
        if self._active is not None:
            x = self._active.trim_padding(x)
        return self._collective("all_gather", comm.all_gather, x, self.device)
