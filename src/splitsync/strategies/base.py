"""The strategy seam: everything that differs between DDP, FSDP2, DataParallel and one module.

A :class:`Strategy` is stateless; each strategy module exposes one instance as ``STRATEGY``.
The rest of splitsync asks the strategy (found by name, or by :func:`for_model` for a wrapped
model) and never checks wrapper types itself. The defaults here are those of a plain module
in one process: no gradient sync to switch, an ordinary GradScaler, compile in place, nothing
to join, and state that is not sharded.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from splitsync.strategies.blocks import default_blocks
from splitsync.strategies.modules import unwrap

if TYPE_CHECKING:
    from torch.distributed.algorithms.join import Joinable

    from splitsync.strategies.count import CountSync
    from splitsync.train.precision import Precision

__all__ = ["Strategy", "WrapContext", "SyncSetter", "unwrap", "frozen_copy", "meta_copy"]

SyncSetter = Callable[[bool], None]


@dataclass(frozen=True)
class WrapContext:
    """What a strategy needs to know about the run to wrap a module."""

    device: torch.device
    world_size: int
    rank: int = 0
    precision: Precision | None = None  # the run's policy object; None: plain fp32
    local_world_size: int | None = None  # processes on this node (HSDP's default shard size)
    mesh: Any = None  # the run's DeviceMesh under init(mesh=...) (None: none, or one process)
    mesh_shape: Any = None  # its sizes (splitsync.distributed.mesh.MeshShape), even at one process


def frozen_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with its own storage, ``requires_grad`` off, and the class's
    own forward: a forward set on the instance (autocast, accumulation sync, a guard) or a
    ``module.compile()`` still points at the original module, so the copy drops them."""
    out = copy.deepcopy(module)
    for sub in out.modules():
        sub.__dict__.pop("forward", None)
        sub.__dict__.pop("_compiled_call_impl", None)
    return out.requires_grad_(False)


def meta_copy(module: nn.Module) -> nn.Module:
    """The structure of ``module`` with every parameter and buffer on the meta device
    (no storage is copied); shared tensors stay shared."""
    memo: dict[int, Any] = {}
    for t in (*module.parameters(), *module.buffers()):
        if id(t) not in memo:
            meta = torch.empty_like(t, device="meta")
            memo[id(t)] = (nn.Parameter(meta, requires_grad=t.requires_grad)
                           if isinstance(t, nn.Parameter) else meta)
    return copy.deepcopy(module, memo)


@contextmanager
def sync_off(setter: SyncSetter) -> Iterator[None]:
    """Gradient sync off inside the block, back on after it."""
    setter(False)
    try:
        yield
    finally:
        setter(True)


class Strategy:
    """A named way to wrap a module, and everything that follows from the wrapper."""

    name: str = ""
    options: tuple[str, ...] = ()  # keyword options wrap() accepts
    replaces_parameters: bool = False  # wrap() swaps nn.Parameters (FSDP2: for DTensors)
    places_module: bool = False  # wrap() places the module itself; else Run moves it first

    def __repr__(self) -> str:
        return f"<Strategy {self.name!r}>"

    # --- wrapping ----------------------------------------------------------------------
    def owns(self, model: nn.Module) -> bool:
        """Whether ``model`` is a wrapper this strategy makes."""
        return False

    def places(self, options: Mapping[str, Any]) -> bool:
        """Whether :meth:`wrap` places the module itself under ``options`` (else the Run
        moves it to the device first)."""
        return self.places_module

    def blocks(self, module: nn.Module, options: Mapping[str, Any]) -> list[nn.Module]:
        """The module's repeated blocks (what ``activation_checkpointing=True`` recomputes;
        FSDP's units of sharding)."""
        return default_blocks(module)

    def wrap(self, module: nn.Module, ctx: WrapContext, options: Mapping[str, Any]) -> nn.Module:
        """The module, wrapped for this strategy (already on ``ctx.device`` unless
        :meth:`places`)."""
        return module

    # --- gradient sync for accumulation ------------------------------------------------
    def sync_setter(self, model: nn.Module) -> SyncSetter | None:
        """A function turning gradient sync of ``model`` on/off; None if it never syncs."""
        return None

    def no_sync(self, model: nn.Module) -> AbstractContextManager[None]:
        """No gradient sync inside the block (a no-op for a model that never syncs)."""
        setter = self.sync_setter(model)
        return nullcontext() if setter is None else sync_off(setter)

    def count_sync(self, model: nn.Module) -> CountSync | None:
        """How ``model``'s gradient reduction divides by the items of all ranks under
        ``run.backward(loss, count=n)`` (``strategies/count.py``); None: it does not, and
        the step rescales its gradients. Asked once per model, at world size > 1."""
        return None

    # --- precision ---------------------------------------------------------------------
    def make_scaler(self, precision: Precision, model: nn.Module | None = None) -> Any:
        """The GradScaler this strategy needs under ``precision`` (None without scaling) for
        ``model`` as :meth:`wrap` returned it (None: any model of this strategy)."""
        return precision.make_scaler()

    # --- torch.compile -----------------------------------------------------------------
    def compile(self, model: nn.Module, options: Mapping[str, Any]) -> nn.Module:
        """Compile the wrapped ``model`` in place and return it: the user's module inside
        the wrapper is compiled, so the wrapper's own forward runs eagerly around it."""
        unwrap(model).compile(**options)
        return model

    # --- uneven inputs -----------------------------------------------------------------
    def joinables(self, model: nn.Module) -> list[Joinable]:
        """What ``torch.distributed.algorithms.Join`` must join for ``model`` (none here)."""
        return []

    # --- state -------------------------------------------------------------------------
    def is_sharded(self, model: nn.Module) -> bool:
        """Whether the state lives in shards (checkpoints then go through DCP)."""
        return False

    def state_module(self, model: nn.Module) -> nn.Module:
        """The module whose state ``torch.distributed.checkpoint.state_dict`` reads and
        writes: the user's module under the wrappers (DDP, DataParallel, compile, and an EMA's
        ``AveragedModel``), so names and contents match what checkpoints always held."""
        return unwrap(model)

    # --- an open accumulation window (a checkpoint keeps it) ----------------------------
    def window_grads(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This rank's gradients accumulated so far in an open accumulation window, by the
        user's parameter names: here each parameter's ``.grad`` (under DDP these are local,
        not yet all-reduced: a window's micro-steps do not sync)."""
        return {n: p.grad for n, p in self.state_module(model).named_parameters()
                if p.grad is not None}

    def restore_window_grads(self, model: nn.Module, grads: Mapping[str, torch.Tensor]) -> None:
        """Put back what :meth:`window_grads` returned, so the next micro-step accumulates
        onto it as the interrupted run's did."""
        params = dict(self.state_module(model).named_parameters())
        for name, grad in grads.items():
            p = params[name]
            p.grad = grad.to(device=p.device, dtype=p.dtype, copy=True)

    # --- copies (run.ema) ----------------------------------------------------------------
    def template(self, module: nn.Module) -> nn.Module | None:
        """What :meth:`replica` needs to rebuild the wrapped model, taken just before
        :meth:`wrap` (None here: the wrapped model can be copied directly)."""
        return None

    def replica(self, model: nn.Module, template: nn.Module | None, ctx: WrapContext,
                options: Mapping[str, Any]) -> nn.Module:
        """A frozen copy of the wrapped ``model``'s weights, laid out as the model holds
        them (here: the user's module, whole); no gradient sync, never trained."""
        return frozen_copy(unwrap(model))
