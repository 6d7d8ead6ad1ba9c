"""One state path for every strategy: ``torch.distributed.checkpoint.state_dict``.

Plain modules, DDP, compiled modules and FSDP2 (on a 1-D or 2-D mesh) all go through
``get_/set_model_state_dict`` and ``get_/set_optimizer_state_dict``: parameter names without
wrapper prefixes, optimizer state keyed by those names. The strategy says only which module
holds the state (:meth:`Strategy.state_module`: the user's module under DDP, DataParallel,
compile or an EMA's ``AveragedModel``; an FSDP2 module itself) and whether it is sharded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from splitsync.errors import CheckpointError
from splitsync.strategies import for_model
from splitsync.strategies.modules import unwrap
from splitsync.strategies.state import optimizer_to_fqn

__all__ = ["model_state", "optimizer_state", "load_model_state", "load_optimizer_state",
           "state_shapes", "check_optimizer_names", "is_sharded"]


def _options(full: bool, offload: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=offload)


def _holder(model: nn.Module) -> nn.Module:
    return for_model(model).state_module(model)


def is_sharded(model: nn.Module) -> bool:
    """Whether the model's state lives in shards (written through DCP by every rank)."""
    return for_model(model).is_sharded(model)


def model_state(model: nn.Module, *, full: bool, offload: bool) -> dict[str, Any]:
    """The model's state by the user's names. ``full``: whole tensors (collective when
    sharded, kept on rank 0 only with ``offload``); else this rank's shards as DTensors.
    ``offload``: on CPU. Unsharded CPU tensors are the live ones (views, not copies)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(_holder(model), options=_options(full, offload))


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, *, full: bool,
                    offload: bool, template: bool = False) -> dict[str, Any]:
    """The optimizer's state keyed by parameter names (layout of
    ``get_optimizer_state_dict``). An optimizer that has not stepped yet is saved as it is:
    DCP would make its state by taking a step with lr 0, which changes what an uninterrupted
    run does next (and would happen on rank 0 only for unsharded models). ``template``: a
    state to load into, so DCP may make it (what is loaded replaces it)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if not optimizer.state and not template and not is_sharded(model):
        return optimizer_to_fqn(_holder(model), optimizer)
    return get_optimizer_state_dict(_holder(model), optimizer, options=_options(full, offload))


def load_model_state(model: nn.Module, state: Mapping[str, Any], *, full: bool) -> None:
    """Load a state dict by the user's names (``full``: whole tensors, resharded here)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(_holder(model), dict(state), options=_options(full, False))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                         state: Mapping[str, Any], *, full: bool) -> None:
    """Load a name-keyed optimizer state (``full``: whole tensors, resharded here)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    # DCP first gives an optimizer without state one, by stepping it with zero gradients at
    # lr 0: a whole optimizer step (AdamW's state allocated and swept, most of a resume's
    # time), whose state load_state_dict then replaces, and which an optimizer that changes
    # parameters whatever its lr would apply to the weights just loaded. Loading unsharded
    # state needs none of it (DCP pairs names with parameters and calls load_state_dict);
    # DCP skips that step for an optimizer whose state is not empty.
    first = next((p for g in optimizer.param_groups for p in g["params"]), None)
    marked = not full and not optimizer.state and first is not None and not is_sharded(model)
    if marked:
        optimizer.state[first] = {}
    try:
        set_optimizer_state_dict(_holder(model), optimizer, dict(state),
                                 options=_options(full, False))
    except BaseException:
        if marked and optimizer.state.get(first) == {}:  # a failed load leaves no mark
            del optimizer.state[first]
        raise


def state_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Global shapes of the model's state by the user's names (no communication)."""
    return {k: tuple(v.shape) for k, v in model_state(model, full=False, offload=False).items()
            if isinstance(v, torch.Tensor)}


def check_optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer,
                          state: Mapping[str, Any]) -> None:
    """Raise if a saved optimizer state names a parameter this optimizer does not hold."""
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    mine = {n for n, p in unwrap(model).named_parameters() if id(p) in ids}
    for name in [*state.get("state", {}),
                 *(n for g in state.get("param_groups", []) for n in g.get("params", []))]:
        if name not in mine:
            raise CheckpointError(f"the optimizer state names parameter {name!r}, which this "
                                  "optimizer does not hold")
