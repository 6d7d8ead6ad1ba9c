"""``run.meter()``: metrics that accumulate over an epoch and survive a resume.

Each rank keeps, per key, the sum of ``value * count`` and the sum of ``count`` over what it
added (on the run's device, in float64: no host sync per ``add``). ``compute()`` all-reduces
them (one collective) and returns each key's weighted mean over every rank. The meter is
saved with the checkpoints: at a save every rank reduces its sums (the save is collective
anyway) and rank 0 writes the totals; a resume gives rank 0 the totals and the other ranks
zeros, so ``compute()`` after it covers the whole epoch, at any world size. Equal to an
uninterrupted run's up to float64 rounding (the sums are added in another order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from numbers import Number
from typing import Any

import torch

from splitsync.observe import Observer

__all__ = ["EpochMeter", "METER_NAME"]

METER_NAME = "meter"  # checkpoint names: "meter", "meter_1", ... in the order run.meter made them


class EpochMeter(Observer):
    """Per key, a sum of ``value * count`` and of ``count``, reduced over ranks on read."""

    def __init__(self, device: torch.device, rank: int,
                 reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.device = device
        self.rank = rank
        self._reduce = reduce  # all-reduce (sum) through the run's collectives
        self._dtype = torch.float32 if device.type == "mps" else torch.float64
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, torch.Tensor] = {}
        self._saved: dict[str, Any] | None = None  # the totals the next state_dict writes

    def _zero(self) -> torch.Tensor:
        return torch.zeros((), dtype=self._dtype, device=self.device)

    @torch.no_grad()
    def add(self, values: Mapping[str, Any] | None = None, *, count: Any = 1,
            **more: Any) -> None:
        """Add each value (a number or a one-element tensor, e.g. a batch's mean loss)
        weighted by ``count`` (e.g. the batch's size): ``meter.add(loss=loss, count=n)``.
        Every rank adds the same keys (``compute`` reduces them in one vector)."""
        items = {**(values or {}), **more}
        c = count.detach().to(self.device, self._dtype) if isinstance(count, torch.Tensor) \
            else float(count)
        for key, v in items.items():
            if isinstance(v, torch.Tensor):
                if v.numel() != 1:
                    raise ValueError(f"meter.add({key}=...): a tensor of {v.numel()} "
                                     "elements; give one number per key (e.g. its mean).")
                v = v.detach().reshape(()).to(self.device, self._dtype)
            elif not isinstance(v, Number) or isinstance(v, bool):
                raise TypeError(f"meter.add({key}={v!r}): give a number or a one-element "
                                "tensor.")
            if key not in self._sums:
                self._sums[key], self._counts[key] = self._zero(), self._zero()
            self._sums[key] += v * c
            self._counts[key] += c

    def _totals(self) -> tuple[list[str], torch.Tensor]:
        keys = sorted(self._sums)
        flat = torch.stack([*(self._sums[k] for k in keys), *(self._counts[k] for k in keys)]) \
            if keys else torch.zeros(0, dtype=self._dtype, device=self.device)
        return keys, self._reduce(flat)

    def compute(self) -> dict[str, float]:
        """Each key's weighted mean over every rank (collective: every rank calls it)."""
        keys, total = self._totals()
        n = len(keys)
        return {k: float(total[i] / total[n + i]) if float(total[n + i]) else float("nan")
                for i, k in enumerate(keys)}

    def reset(self) -> None:
        """Forget everything added (call it when an epoch begins)."""
        self._sums, self._counts = {}, {}

    # --- checkpoints ----------------------------------------------------------------------
    def before_save(self, step: int | None) -> None:
        keys, total = self._totals()  # collective, like the save
        n = len(keys)
        self._saved = {"sums": {k: total[i].cpu() for i, k in enumerate(keys)},
                       "counts": {k: total[n + i].cpu() for i, k in enumerate(keys)}}

    def state_dict(self) -> dict[str, Any]:
        """The totals over every rank, as reduced when the save began."""
        if self._saved is None:  # outside a save (one process): this rank's own
            return {"sums": {k: v.cpu() for k, v in self._sums.items()},
                    "counts": {k: v.cpu() for k, v in self._counts.items()}}
        return self._saved

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Rank 0 takes the saved totals, the other ranks start from zero."""
        self.reset()
        for k, v in state["sums"].items():
            mine = self.rank == 0
            self._sums[k] = v.to(self.device, self._dtype) if mine else self._zero()
            self._counts[k] = (state["counts"][k].to(self.device, self._dtype) if mine
                               else self._zero())
