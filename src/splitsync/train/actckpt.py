"""Activation checkpointing: chosen submodules keep only their inputs and recompute the rest
in backward.

Each chosen submodule's forward runs under ``torch.utils.checkpoint.checkpoint`` with
``use_reentrant=False`` (the RNG state is replayed, so dropout recomputes the same mask).
The forward is replaced on the instance, before any wrapper: parameter names, state dicts
and checkpoints are unchanged, FSDP2's hooks (registered on the module when it is sharded
later) run outside the recomputed region exactly as around torchtitan's checkpoint wrapper,
and ``torch.compile`` traces the checkpoint as one region.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import MethodType
from typing import Any

from torch import nn

__all__ = ["apply_activation_checkpointing", "is_checkpointed", "rebind_forwards",
           "has_bound_forwards"]

_MARK = "__splitsync_checkpointed__"
_HOW = "give True, a module class, a tuple of classes, or a predicate fn(module) -> bool"


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import checkpoint

    # The class's forward, looked up at call time: a deepcopy of the module (an EMA, say)
    # gets this method bound to the copy, never the original's forward.
    return checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)



def is_checkpointed(module: nn.Module) -> bool:
    """Whether ``module``'s forward runs under activation checkpointing."""
    forward = module.__dict__.get("forward")
    if forward is None:
        return False
    return getattr(forward, "__func__", None) is _checkpointed_forward or getattr(
        forward, _MARK, False)


def _checkpoint(module: nn.Module) -> None:
    if is_checkpointed(module):
        return  # run.model called again on the same module: once is enough
    inner = module.__dict__.get("forward")
    if inner is None:
        module.forward = MethodType(_checkpointed_forward, module)
        return

    def forward(*args: Any, **kwargs: Any) -> Any:  # the instance had its own forward
        from torch.utils.checkpoint import checkpoint

        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    setattr(forward, _MARK, True)
    module.forward = forward


def has_bound_forwards(module: nn.Module) -> bool:
    """Whether a submodule of ``module`` has a forward method set on the instance."""
    return any(isinstance(m.__dict__.get("forward"), MethodType) for m in module.modules())


def rebind_forwards(original: nn.Module, replica: nn.Module) -> None:
    """Bind forwards set on instances of ``original`` to the matching submodules of a shallow
    ``replica`` (DataParallel's replicate copies them still bound to the original)."""
    for orig, rep in zip(original.modules(), replica.modules(), strict=True):
        forward = rep.__dict__.get("forward")
        if rep is not orig and isinstance(forward, MethodType) and forward.__self__ is orig:
            rep.forward = MethodType(forward.__func__, rep)


def _outermost(module: nn.Module, match: Callable[[nn.Module], bool]) -> Iterator[nn.Module]:
    for child in module.children():
        if match(child):
            yield child
        else:
            yield from _outermost(child, match)


def _types_present(module: nn.Module) -> list[str]:
    seen: dict[str, None] = {}
    for sub in module.modules():
        if sub is not module:
            seen.setdefault(type(sub).__name__, None)
    return list(seen)


def _describe(spec: Any) -> str:
    if isinstance(spec, type):
        return spec.__name__
    if isinstance(spec, tuple):
        return "(" + ", ".join(_describe(s) for s in spec) + ")"
    return getattr(spec, "__name__", repr(spec))


def _matcher(spec: Any) -> Callable[[nn.Module], bool]:
    if isinstance(spec, type) or (isinstance(spec, tuple) and spec):
        kinds = spec if isinstance(spec, tuple) else (spec,)
        if not all(isinstance(k, type) and issubclass(k, nn.Module) for k in kinds):
            raise TypeError(f"activation_checkpointing={spec!r}: classes must be nn.Module "
                            f"subclasses; {_HOW}.")
        return lambda m: isinstance(m, kinds)
    if callable(spec) and not isinstance(spec, nn.Module):
        return lambda m: bool(spec(m))
    raise TypeError(f"activation_checkpointing={spec!r}: {_HOW}.")


def apply_activation_checkpointing(module: nn.Module, spec: Any,
                                   blocks: Callable[[], list[nn.Module]]) -> list[nn.Module]:
    """Checkpoint the submodules of ``module`` that ``spec`` selects; return them.

    ``spec``: None or False (nothing), True (``blocks()``: the blocks FSDP would shard), a
    module class or tuple of classes, or a predicate ``fn(module) -> bool``. Classes and
    predicates select the outermost matching submodules (never ``module`` itself). A
    selection that matches nothing is an error that lists the submodule types present.
    """
    if spec is None or spec is False:
        return []
    name = type(module).__name__
    if spec is True:
        chosen = blocks()
        if not chosen:
            raise ValueError(
                f"activation_checkpointing=True: {name} has no repeated blocks to checkpoint "
                f"(its submodule types are {_types_present(module)}); pass the class to "
                "checkpoint, e.g. activation_checkpointing=Block, or a predicate "
                "fn(module) -> bool.")
    else:
        chosen = list(_outermost(module, _matcher(spec)))
        if not chosen:
            raise ValueError(
                f"activation_checkpointing={_describe(spec)} matches no submodule of {name}; "
                f"its submodule types are {_types_present(module)}. Pass one of those "
                "classes (or a tuple of them), or a predicate fn(module) -> bool.")
    for sub in chosen:
        _checkpoint(sub)
    return chosen
