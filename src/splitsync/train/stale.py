"""Optimizers holding parameters that ``run.model`` replaced: found at their first step.

FSDP2's ``fully_shard`` swaps a module's ``nn.Parameter`` objects for sharded DTensor ones
(``Strategy.replaces_parameters``), and a cast or move can make new parameter objects too
(``torch.__future__.set_overwrite_module_params_on_conversion``, devices without in-place
conversion). An optimizer built on the module before ``run.model`` then updates parameters
nothing uses any more, and training silently changes nothing. ``run.model`` remembers the
parameters it retired (weakly: it keeps none alive) and ``run.step`` checks each optimizer
once, the first time it sees it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from torch import nn

from splitsync.errors import StaleOptimizerError

__all__ = ["RetiredParameters", "StaleOptimizerError"]


class RetiredParameters:
    """The parameter objects run.model replaced, and why (by id, weakly referenced)."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[nn.Parameter], str]] = {}

    def record(self, before: Iterable[nn.Parameter], model: nn.Module, why: str) -> None:
        """``before``: the user's module's parameters; ``model``: what run.model returns."""
        current = {id(p) for p in model.parameters()}
        for p in before:
            if id(p) not in current:
                self._by_id[id(p)] = (weakref.ref(p), why)

    def check(self, optimizer: Any) -> None:
        """Raise :class:`StaleOptimizerError` if ``optimizer`` holds a retired parameter."""
        if not self._by_id:
            return
        stale, whys = 0, []
        total = 0
        for group in getattr(optimizer, "param_groups", ()):
            for p in group["params"]:
                total += 1
                entry = self._by_id.get(id(p))
                if entry is not None and entry[0]() is p:  # the same object, not a reused id
                    stale += 1
                    if entry[1] not in whys:
                        whys.append(entry[1])
        if stale:
            raise StaleOptimizerError(
                f"run.step({type(optimizer).__name__}): {stale} of the optimizer's {total} "
                f"parameters are not the model's any more: {'; '.join(whys)}. The optimizer "
                "was built before run.model(...), so it would update the old parameters and "
                "training would change nothing. Build the optimizer after run.model: "
                "`model = run.model(net)` then `opt = torch.optim.AdamW(model.parameters(), "
                "...)`.")
