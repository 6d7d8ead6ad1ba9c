"""One walker over nested batches: tensors inside dicts, lists, tuples, namedtuples,
other Mappings and dataclasses.

Built on ``optree``: a well-kept pytree library (the C++ one PyTorch itself can use for
``torch.utils._cxx_pytree``), fast on the common containers, and public and stable, which
``torch.utils._pytree`` (private) is not. optree handles dict, OrderedDict, defaultdict,
list, tuple, namedtuple and deque itself; the containers it leaves as leaves (other Mapping
types, list/tuple subclasses, dataclasses) are walked here, without registering anything
globally. Imported on first use only: ``import splitsync`` stays cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import optree
import torch

__all__ = ["map_tensors", "iter_tensors"]


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """``obj`` with every tensor ``t`` inside it replaced by ``fn(t)``; containers keep
    their types (a Mapping type that cannot be rebuilt from a dict becomes a dict)."""
    def leaf(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return fn(x)
        return _other(fn, x)

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    return optree.tree_map(leaf, obj, none_is_leaf=True)


def _other(fn: Callable[[torch.Tensor], Any], x: Any) -> Any:
    if isinstance(x, Mapping):
        moved = {k: map_tensors(fn, v) for k, v in x.items()}
        try:  # keep dict-like batch types
            return type(x)(moved)
        except TypeError:
            return moved
    if isinstance(x, (list, tuple)):  # subclasses optree does not know
        return type(x)(map_tensors(fn, v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        changes = {f.name: map_tensors(fn, getattr(x, f.name))
                   for f in dataclasses.fields(x) if f.init}
        return dataclasses.replace(x, **changes)
    return x


def iter_tensors(obj: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor inside ``obj``; a path reads like
    ``input[0]['x']`` (``.name`` for a dataclass field)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
        return
    paths, leaves, _ = optree.tree_flatten_with_path(obj, none_is_leaf=True)
    for keys, leaf in zip(paths, leaves, strict=True):
        where = path + "".join(f"[{k}]" if isinstance(k, int) else f"[{k!r}]" for k in keys)
        if isinstance(leaf, torch.Tensor):
            yield where, leaf
        elif isinstance(leaf, Mapping):
            for k, v in leaf.items():
                yield from iter_tensors(v, f"{where}[{k!r}]")
        elif isinstance(leaf, (list, tuple)):
            for i, v in enumerate(leaf):
                yield from iter_tensors(v, f"{where}[{i}]")
        elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            for f in dataclasses.fields(leaf):
                yield from iter_tensors(getattr(leaf, f.name), f"{where}.{f.name}")

