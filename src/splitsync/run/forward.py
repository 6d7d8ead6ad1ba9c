"""What a model's forward and its sync contexts know of the run's micro-step:
``run.model``'s forward (the precision's autocast, the accumulation sync), ``run.accumulate``,
``run.no_sync`` and ``run.join``.

DDP decides in forward whether a backward syncs (``require_backward_grad_sync`` is what
``no_sync()`` toggles); FSDP2 reads ``set_requires_gradient_sync`` in backward. So the
forward a run installs asks the :class:`~splitsync.run.step.StepPlan` whether the coming
micro-step ends an accumulation window (``sync_now``) and sets the strategy's switch, and the
ordinary loop is correct with ``init(accumulate=k)`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.distributed.algorithms.join import Join, Joinable

from splitsync.strategies import Strategy, SyncSetter, for_model
from splitsync.train.precision import Precision, forward_with

if TYPE_CHECKING:
    from splitsync.run.step import StepPlan

__all__ = ["install_forward", "accumulate", "no_sync", "prepare_module", "join"]


def prepare_module(module: nn.Module, precision: Precision) -> nn.Module:
    """Cast parameters for "bf16-true" (before any wrapper builds buckets or shards)."""
    if precision.param_dtype is not None:
        module = module.to(precision.param_dtype)
    return module


def install_forward(plan: StepPlan, model: nn.Module, autocast: bool = True,
                    strategy: Strategy | None = None) -> nn.Module:
    """Give ``model`` a forward with the precision's autocast and the accumulation sync.

    The forward is replaced on the instance (keys of ``state_dict`` are unchanged); when
    neither is needed the model is returned untouched. ``autocast=False`` leaves autocast
    to the user (``run.autocast()``).
    """
    strategy = for_model(model) if strategy is None else strategy
    plan.adopt(model, strategy)
    forward = model.forward
    precision = plan.precision if autocast else replace(plan.precision, autocast_dtype=None)
    wrapped = forward_with(forward, precision)
    setter = strategy.sync_setter(model) if plan.every > 1 else None
    if setter is not None:
        wrapped = _synced(wrapped, setter, plan)
    if wrapped is not forward:
        model.forward = wrapped
    return model


def _synced(forward: Callable[..., Any], setter: SyncSetter,
            plan: StepPlan) -> Callable[..., Any]:
    def synced_forward(*args: Any, **kwargs: Any) -> Any:
        setter(not plan.held and plan.sync_now)
        return forward(*args, **kwargs)

    return synced_forward


def accumulate(plan: StepPlan, model: nn.Module) -> AbstractContextManager[None]:
    """Skip gradient sync for the coming micro-step unless it ends the window."""
    if plan.sync_now:
        return nullcontext()
    return for_model(model).no_sync(model)


@contextmanager
def no_sync(plan: StepPlan, model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """No gradient sync of ``model`` inside the block, whatever the accumulation window
    says (the forward :func:`install_forward` gave it reads ``plan.held``)."""
    if not enabled:
        yield
        return
    plan.held += 1
    try:
        with for_model(model).no_sync(model):
            yield
    finally:
        plan.held -= 1


def join(*objects: nn.Module | Joinable, enable: bool = True,
         throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
    """``torch.distributed.algorithms.Join`` over the models' joinables (DDP) and Joinables.

    Each model's strategy says what to join: a single-process model needs nothing (a no-op
    context); FSDP has no join support in PyTorch and raises with the fix (give every rank
    the same number of batches, ``run.loader(..., drop_last=True)``).
    """
    joinables: list[Any] = []
    for obj in objects:
        if isinstance(obj, Joinable):
            joinables.append(obj)
        elif isinstance(obj, nn.Module):
            joinables.extend(for_model(obj).joinables(obj))
        else:
            raise TypeError(f"run.join() takes models (or Joinables), got {type(obj).__name__}.")
    if not joinables or not enable:
        return nullcontext()
    return Join(joinables, enable=enable, throw_on_early_termination=throw_on_early_termination)
