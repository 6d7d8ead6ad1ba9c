"""``torch.compile`` applied in the right place relative to the strategy's wrapper."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from splitsync.strategies import unwrap

__all__ = ["compile_model"]


def compile_model(model: nn.Module, strategy: str, options: bool | Mapping[str, Any]) -> nn.Module:
    """Compile the wrapped ``model`` in place and return it.

    DDP: the user's module inside DDP is compiled, so DDP's forward runs eagerly and calls
    the compiled module; that is what ``torch.compile(ddp_model)`` does too, and it lets
    Dynamo's DDP optimizer split graphs at bucket boundaries (wrap first, then compile).
    FSDP2: each sharded block's forward is compiled; the unshard/reshard hooks stay eager.
    DataParallel replicates the module every step and cannot carry a compiled one.
    ``options`` is True or keyword arguments for ``torch.compile`` (e.g. ``{"mode": ...}``).
    """
    kwargs = {} if options is True else dict(options)  # type: ignore[arg-type]
    if strategy == "dp":
        raise ValueError(
            "run.model(..., compile=True) does not work with strategy='dp' (DataParallel "
            "re-replicates the module every step). Use strategy='ddp' to compile."
        )
    if strategy == "fsdp":
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            from splitsync.strategies.fsdp import compile_blocks

            compile_blocks(model, kwargs)
            return model
    unwrap(model).compile(**kwargs)
    return model
