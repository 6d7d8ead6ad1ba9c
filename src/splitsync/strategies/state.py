"""State helpers the strategies share: is a model sharded, and an optimizer's state by names.

Optimizer state is keyed by parameter names instead of positions (the layout of
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from splitsync.strategies.modules import unwrap

__all__ = ["optimizer_to_fqn", "has_dtensor_params"]


def _param_fqns(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in unwrap(model).named_parameters()}


def optimizer_to_fqn(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` keyed by parameter names instead of positions."""
    names = _param_fqns(model)
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    raw = optimizer.state_dict()
    state = {order[pid]: {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                          for k, v in st.items()}
             for pid, st in raw["state"].items()}
    groups = [{**g, "params": [order[pid] for pid in g["params"]]} for g in raw["param_groups"]]
    return {"state": state, "param_groups": groups}


def has_dtensor_params(model: nn.Module) -> bool:
    """True when any parameter is a DTensor (FSDP2, or tensor parallel by hand)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())
