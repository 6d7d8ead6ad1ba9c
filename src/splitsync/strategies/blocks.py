"""A model's repeated blocks: FSDP's units of sharding, and what ``activation_checkpointing=True``
recomputes.

The blocks are the outermost instances of the repeated submodule type that holds the most
parameters (a transformer's blocks, a plain MLP's Linear layers), or the types/instances the
user names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from torch import nn

__all__ = ["default_blocks", "outermost", "given_blocks", "submodule_types"]


def default_blocks(module: nn.Module) -> list[nn.Module]:
    """Instances of the repeated submodule type holding the most parameters.

    Repeated composite types (transformer blocks) win over repeated layers (the Linear
    layers inside them); a plain MLP yields its Linear layers. Only the outermost
    instances of the chosen type are returned.
    """
    counts: Counter[type[nn.Module]] = Counter()
    sizes: Counter[type[nn.Module]] = Counter()
    composite: set[type[nn.Module]] = set()
    for sub in module.modules():
        if sub is module or isinstance(sub, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            continue
        n = sum(p.numel() for p in sub.parameters())
        if n:
            counts[type(sub)] += 1
            sizes[type(sub)] += n
            if any(True for _ in sub.children()):
                composite.add(type(sub))
    repeated = [t for t, c in counts.items() if c >= 2]
    if not repeated:
        return []
    chosen = max(repeated, key=lambda t: (t in composite, sizes[t]))
    return list(outermost(module, chosen))


def outermost(module: nn.Module, kind: type[nn.Module] | tuple[type[nn.Module], ...]
              ) -> Iterator[nn.Module]:
    """Submodules of ``module`` that are ``kind``, not descending into a match."""
    for child in module.children():
        if isinstance(child, kind):
            yield child
        else:
            yield from outermost(child, kind)


def given_blocks(module: nn.Module, given: Any, what: str = "fsdp blocks") -> list[nn.Module]:
    """The blocks ``given`` names (types or instances; None: :func:`default_blocks`), checked."""
    if given is None:
        return default_blocks(module)
    if isinstance(given, type) or isinstance(given, nn.Module):
        given = [given]
    types = tuple(g for g in given if isinstance(g, type))
    mods = [g for g in given if isinstance(g, nn.Module)]
    bad = [g for g in given if not isinstance(g, (type, nn.Module))]
    if bad or (types and not all(issubclass(t, nn.Module) for t in types)):
        raise TypeError(
            f"{what}={given!r}: give module types (e.g. [Block]) or module instances."
        )
    inside = {id(m) for m in module.modules()}
    stray = [type(m).__name__ for m in mods if id(m) not in inside or m is module]
    if stray:
        raise ValueError(f"{what}: {stray} are not submodules of the model.")
    found = list(outermost(module, types)) if types else []
    if types and not found:
        raise ValueError(
            f"{what}: the model has no submodule of type {[t.__name__ for t in types]}; "
            f"its submodule types are {submodule_types(module)}."
        )
    return found + [m for m in mods if all(m is not f for f in found)]


def submodule_types(module: nn.Module) -> list[str]:
    """Names of the types of ``module``'s submodules (not itself), in first-seen order."""
    seen: dict[str, None] = {}
    for sub in module.modules():
        if sub is not module:
            seen.setdefault(type(sub).__name__, None)
    return list(seen)
