"""Whole (unsharded) state with the user's parameter names: the default strategy's state IO.

Optimizer state is keyed by parameter names instead of positions, so it does not depend on
parameter order and loads into a sharded model too (the layout of
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from splitsync.errors import CheckpointError
from splitsync.strategies.modules import unwrap

__all__ = ["module_state", "optimizer_to_fqn", "optimizer_from_fqn", "has_dtensor_params"]


def module_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The user's module's state dict (no DDP/compile prefixes), detached on CPU."""
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


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


def optimizer_from_fqn(model: nn.Module, optimizer: torch.optim.Optimizer,
                       osd: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`optimizer_to_fqn` for ``optimizer`` (positions of its own params)."""
    names = _param_fqns(model)
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    pid = {name: i for i, name in enumerate(order)}
    try:
        state = {pid[name]: st for name, st in osd["state"].items()}
        groups = [{**g, "params": [pid[n] for n in g["params"]]} for g in osd["param_groups"]]
    except KeyError as e:
        raise CheckpointError(f"the optimizer state names parameter {e.args[0]!r}, which this "
                              "optimizer does not hold") from None
    return {"state": state, "param_groups": groups}


def has_dtensor_params(model: nn.Module) -> bool:
    """True when any parameter is a DTensor (FSDP2, or tensor parallel by hand)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())
