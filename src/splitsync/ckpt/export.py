"""Final weights as one unsharded safetensors file, from any strategy."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from splitsync.ckpt.state import is_sharded, model_state
from splitsync.distributed import comm

__all__ = ["export_safetensors"]


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
        # Clones break storage sharing (tied weights), which safetensors refuses to write.
        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()
                   if isinstance(v, torch.Tensor)}
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
