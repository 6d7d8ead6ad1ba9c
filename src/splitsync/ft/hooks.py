"""The gradient hooks of a fault-tolerant run: the mean inside the group, then across groups.

No ``from __future__ import annotations`` in this module: DDP's ``register_comm_hook``
checks that the hook's ``bucket`` and return annotations *are* ``dist.GradBucket`` and
``torch.futures.Future[torch.Tensor]``, and refuses the strings that postponed annotations
would make of them ("bucket annotation should be dist.GradBucket").
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["HookState", "ft_comm_hook", "install_ddp_hook", "install_fsdp_hook"]


@dataclass(frozen=True)
class HookState:
    """What the hooks need: the group's session (its Manager is made after ``run.model``,
    by ``run.resume``), and the group's own process group."""

    session: Any  # splitsync.ft.steps.FTSession
    group: Any  # the replica group's process group (None: one process per group)
    size: int  # processes in the replica group


def _done(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(tensor)
    return future


def ft_comm_hook(state: HookState,
                 bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average ``bucket`` over the group's ranks, then over the groups.

    Works around torchft 0.2.0's ``torchft.ddp`` hook, which fails ``assert fut._fut`` when a
    peer group dies mid all-reduce: ``_ManagedWork.wait()`` then catches the error, reports it
    to the Manager and returns before it builds the future chain, so ``_fut`` stays None and
    the survivor crashed (3 kills in 3). Here the failed bucket is handed back in a completed
    future instead; the Manager is already marked errored, so ``should_commit()`` returns
    False and the step is discarded (its samples are trained again). Keep until upstream
    fixes the assert.
    """
    buffer = bucket.buffer()
    if state.group is not None and state.size > 1:
        # Synchronous: a group-mate that died ends the whole group anyway (torchrun restarts it).
        dist.all_reduce(buffer, group=state.group)
        buffer.div_(state.size)
    scale = state.session.scale  # 0 for a group without a batch at the end of the run
    if scale != 1.0:
        buffer.mul_(scale)
    work = state.session.manager.allreduce(buffer)  # SUM across groups, then / participants
    work.wait()  # False (and the Manager errored) when a peer group failed
    future = work.get_future()
    inner = getattr(future, "_fut", future)  # torchft's managed future wraps torch's
    if inner is None:  # the upstream assert's case: the all-reduce failed
        return _done(buffer)
    return inner


def install_ddp_hook(model: nn.parallel.DistributedDataParallel, state: HookState) -> None:
    """Register :func:`ft_comm_hook` on a DDP model (before its first forward)."""
    model.register_comm_hook(state, ft_comm_hook)


def install_fsdp_hook(model: nn.Module, session: Any) -> int:
    """Average every FSDP2 unit's reduce-scattered gradient shard across groups (FSDP's own
    reduce-scatter already took the mean inside the group). Returns the units hooked."""
    from splitsync.strategies.fsdp import sharded_units

    def across_groups(shard: torch.Tensor) -> None:
        scale = session.scale  # 0 for a group without a batch at the end of the run
        if scale != 1.0:
            shard.mul_(scale)
        session.manager.allreduce(shard).wait()  # on failure: the Manager is errored, step discarded

    units = sharded_units(model)
    for unit in units:
        unit.set_all_reduce_hook(across_groups)
    return len(units)
