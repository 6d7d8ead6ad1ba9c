"""Final weights as one unsharded safetensors file, from any strategy."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from splitsync import comm
from splitsync.strategies import for_model

__all__ = ["export_safetensors"]


def export_safetensors(model: nn.Module, path: str | os.PathLike[str], rank: int) -> Path:
    """Collective for sharded models: rank 0 writes ``path`` atomically; every rank returns it."""
    from safetensors.torch import save_file

    out = Path(path)
    # Collective when the strategy shards the model; otherwise only rank 0 reads it.
    sd = for_model(model).full_state(model, rank)
    if rank == 0:
        # Clones break storage sharing (tied weights), which safetensors refuses to write.
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()
                   if isinstance(v, torch.Tensor)}
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".part")
        save_file(tensors, str(part), metadata={"format": "pt"})
        with open(part, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(part, out)
    comm.barrier()
    return out
