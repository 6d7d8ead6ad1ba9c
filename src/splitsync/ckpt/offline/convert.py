"""A checkpoint, sharded or not, as one safetensors file of full weights (``splitsync ckpt
convert``): offline, in one process, every file verified against the manifest first."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from splitsync.ckpt.offline import reading as offline
from splitsync.ckpt.offline.dcpread import read_keys
from splitsync.ckpt.offline.writers import write_hf, write_optimizer, write_safetensors
from splitsync.ckpt.save import STATE_FILE
from splitsync.errors import CheckpointError

__all__ = ["DTYPES", "Converted", "convert", "pick_model", "pick_optimizer", "read_weights",
           "read_optimizer", "cast"]

DTYPES: Mapping[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32,
}


@dataclass(frozen=True)
class Converted:
    """What ``convert`` wrote, and from where."""

    source: str  # the checkpoint read (path or URL of its step folder)
    step: int
    model: str
    out: str  # the safetensors file (inside the folder with --hf)
    tensors: int
    bytes: int
    optimizer: str | None = None  # the optimizer file written, if asked for
    optimizer_name: str | None = None
    dropped: tuple[str, ...] = ()  # model state entries that are not tensors
    skipped: tuple[tuple[str, str], ...] = ()  # newer checkpoints that did not verify


def pick_model(body: Mapping[str, Any], model: str | None, where: str) -> str:
    """The model to convert: ``model``, the only one, or the one the optimizers train."""
    models = list(body["models"])
    if model is not None:
        if model not in models:
            raise CheckpointError(f"{where} holds no model {model!r}; it holds {models}.")
        return model
    if len(models) == 1:
        return models[0]
    if not models:
        raise CheckpointError(f"{where} holds no model state (registered objects: "
                              f"{list(body['objects'])}).")
    owners = sorted(set(body["optimizers"].values()))
    if len(owners) == 1:
        return owners[0]
    raise CheckpointError(f"{where} holds several models {models}; choose one with --model NAME.")


def pick_optimizer(body: Mapping[str, Any], model: str, name: str | None, where: str) -> str:
    """The optimizer of ``model`` (or ``name``) whose state to write."""
    owned = sorted(n for n, owner in body["optimizers"].items() if owner == model)
    if name is not None:
        if name not in body["optimizers"]:
            raise CheckpointError(f"{where} holds no optimizer {name!r}; it holds "
                                  f"{sorted(body['optimizers'])}.")
        return name
    if len(owned) == 1:
        return owned[0]
    if not owned:
        raise CheckpointError(f"{where} holds no optimizer state for model {model!r} "
                              f"(optimizers: {dict(body['optimizers'])}).")
    raise CheckpointError(f"{where}: model {model!r} has several optimizers {owned}; choose one "
                          "with --optimizer-name NAME.")


def read_weights(loc: offline.Location, name: str, body: Mapping[str, Any],
                 loaded: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The model's full state by the user's parameter names (DCP shards gathered here)."""
    if body["layout"] == "sharded":
        sd = read_keys(offline.local_dir(loc, name), {f"model.{model}"})
        return dict(sd.get("model", {}).get(model, {}))
    return dict(offline.state_of(loc, name, dict(loaded))["model"][model])


def read_optimizer(loc: offline.Location, name: str, body: Mapping[str, Any],
                   loaded: Mapping[str, Any], optim: str) -> dict[str, Any]:
    """``{"state": {param name: {...}}, "param_groups": [...]}`` of optimizer ``optim``."""
    if body["layout"] == "sharded":
        sd = read_keys(offline.local_dir(loc, name), {f"optim.{optim}"})
        osd = sd.get("optim", {}).get(optim, {})
    else:
        osd = offline.state_of(loc, name, dict(loaded))["optim"][optim]
    return {"state": dict(osd.get("state", {})), "param_groups": list(osd.get("param_groups", []))}


def cast(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Floating-point tensors in ``dtype`` (integer buffers keep theirs)."""
    if dtype is None:
        return dict(tensors)
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}


def _strip(tensors: dict[str, torch.Tensor], prefix: str | None, where: str) -> dict[str, Any]:
    if not prefix:
        return tensors
    if not all(k.startswith(prefix) for k in tensors):
        bad = next(k for k in tensors if not k.startswith(prefix))
        raise CheckpointError(f"{where}: --strip-prefix {prefix!r} does not begin every "
                              f"parameter name (e.g. {bad!r}).")
    return {k[len(prefix):]: v for k, v in tensors.items()}


def convert(path: str | os.PathLike[str], out: str | os.PathLike[str], *,
            step: int | None = None, model: str | None = None,
            optimizer: str | os.PathLike[str] | None = None, optimizer_name: str | None = None,
            dtype: str | None = None, hf: str | os.PathLike[str] | None = None,
            strip_prefix: str | None = None) -> Converted:
    """Write the newest complete checkpoint at ``path`` (or step ``step``) as one safetensors
    file ``out`` of full weights; with ``hf``, ``out`` is a folder ``from_pretrained`` loads
    (the configuration files of ``hf`` plus ``model.safetensors``)."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}.")
    loc = offline.locate(path)
    skipped: list[tuple[str, str]] = []
    name, body, loaded = offline.choose(loc, step, load=(STATE_FILE,), skipped=skipped)
    where = loc.where(name)
    chosen = pick_model(body, model, where)
    optim = pick_optimizer(body, chosen, optimizer_name, where) if optimizer else None
    state = read_weights(loc, name, body, loaded, chosen)
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    dropped = tuple(sorted(k for k in state if k not in tensors))
    if not tensors:
        raise CheckpointError(f"{where}: model {chosen!r} has no tensors to write.")
    tensors = _strip(cast(tensors, DTYPES[dtype] if dtype else None), strip_prefix, where)
    meta = {"format": "pt", "splitsync_step": str(body["step"]), "splitsync_model": chosen}
    if hf is not None:
        target, tied = write_hf(tensors, str(out), str(hf), meta)
        tensors = {k: v for k, v in tensors.items() if k not in tied}  # what it wrote
    else:
        target = write_safetensors(tensors, str(out), meta)
    opt_out = None
    if optimizer is not None and optim is not None:
        osd = read_optimizer(loc, name, body, loaded, optim)
        opt_out = write_optimizer(osd, str(optimizer), strip_prefix)
    return Converted(source=where, step=int(body["step"]), model=chosen, out=target,
                     tensors=len(tensors), bytes=sum(t.nbytes for t in tensors.values()),
                     optimizer=opt_out, optimizer_name=optim, dropped=dropped,
                     skipped=tuple(skipped))
