"""``torch.compile`` applied in the right place relative to the strategy's wrapper.

Where it goes is the strategy's decision (:meth:`splitsync.strategies.Strategy.compile`):
DDP compiles the user's module inside DDP (DDP's forward runs eagerly and calls the compiled
module, which lets Dynamo's DDP optimizer split graphs at bucket boundaries); FSDP2 compiles
each sharded block's forward, leaving the unshard/reshard hooks eager; DataParallel refuses
(it re-replicates the module every step).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from splitsync.strategies import get_strategy

__all__ = ["compile_model"]


def compile_model(model: nn.Module, strategy: str, options: bool | Mapping[str, Any]) -> nn.Module:
    """Compile the wrapped ``model`` in place for the strategy called ``strategy``; returns it.

    ``options`` is True or keyword arguments for ``torch.compile`` (e.g. ``{"mode": ...}``).
    """
    kwargs: dict[str, Any] = {} if options is True else dict(options)  # type: ignore[arg-type]
    return get_strategy(strategy).compile(model, kwargs)
