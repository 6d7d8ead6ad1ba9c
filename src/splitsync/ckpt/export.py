"""Final weights as one unsharded safetensors file, from any strategy."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.state import is_sharded, model_state
from splitsync.distributed import comm
from splitsync.strategies import for_model

__all__ = ["export_safetensors", "tied_names", "tied_duplicates"]


def tied_duplicates(names: Mapping[str, Any], prefer_dropped: Iterable[str] = ()) -> set[str]:
    """Of names bound to one tensor (``names``: name -> the object it is), all but one: the
    names ``save_pretrained`` and safetensors' ``save_model`` leave out. ``prefer_dropped``
    go first (a Hugging Face model's ``_tied_weights_keys``); else the first sorted stays."""
    groups: dict[int, list[str]] = {}
    for name, obj in names.items():
        groups.setdefault(id(obj), []).append(name)
    drop: set[str] = set()
    for group in groups.values():
        if len(group) > 1:
            keep = sorted(set(group) - set(prefer_dropped)) or sorted(group)
            drop |= set(group) - {keep[0]}
    return drop


def tied_names(model: nn.Module) -> set[str]:
    """The state names of ``model`` (the user's module under its wrappers) that hold a
    tensor another name holds too, all but one per tensor (see :func:`tied_duplicates`)."""
    module = for_model(model).state_module(model)
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(module.named_buffers(remove_duplicate=False))
    return tied_duplicates(named, getattr(module, "_tied_weights_keys", None) or ())


def export_safetensors(model: nn.Module, path: str | os.PathLike[str],
                       rank: int) -> Path | str:
    """Collective for sharded models: rank 0 writes ``path`` atomically; every rank returns it.

    ``path`` may be an fsspec URL: one PUT of the whole file, which object stores make
    visible all at once (no partial file is ever seen).
    """
    from safetensors.torch import save, save_file

    from splitsync.ckpt.fs import ObjectStorage, is_url

    url = is_url(path)
    out: Path | str = str(path) if url else Path(path)
    # Collective when the strategy shards the model; otherwise only rank 0 reads it.
    sd = model_state(model, full=True, offload=True) if rank == 0 or is_sharded(model) else {}
    if rank == 0:
        # Tied weights once, as save_pretrained writes them (from_pretrained and safetensors'
        # load_model tie them again); clones break any other storage sharing, which
        # safetensors refuses to write.
        tied = tied_names(model)
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()
                   if isinstance(v, torch.Tensor) and k not in tied}
        if isinstance(out, str):
            target = ObjectStorage(out.rsplit("/", 1)[0])
            target.fs.makedirs(target.root, exist_ok=True)
            target.fs.pipe_file(f"{target.root}/{out.rsplit('/', 1)[1]}",
                                save(tensors, metadata={"format": "pt"}))
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(out.name + ".part")
            save_file(tensors, str(part), metadata={"format": "pt"})
            with open(part, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(part, out)
    comm.barrier()
    return out
