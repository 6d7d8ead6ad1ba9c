"""Files ``splitsync ckpt convert`` writes: safetensors weights, an optimizer file, and a
folder that Hugging Face ``transformers`` loads with ``from_pretrained``.

Local files are written next to their target and renamed into place once complete (a
reader never sees half a file); URLs are written in one PUT through fsspec.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from splitsync.ckpt.export import tied_duplicates
from splitsync.ckpt.fs import is_url
from splitsync.errors import CheckpointError

__all__ = ["write_safetensors", "write_optimizer", "write_hf", "hf_mismatch", "WEIGHT_SUFFIXES"]

# Weight files in a Hugging Face folder; none is copied from the configuration folder.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
                   ".safetensors.index.json", ".bin.index.json", ".gguf")
HF_WEIGHTS = "model.safetensors"


def _unshared(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, none sharing memory with another (safetensors refuses shared
    storage, e.g. tied embeddings loaded from one pickle): only the repeats are copied."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for k, v in tensors.items():
        v = v.detach().contiguous()
        key = (v.untyped_storage().data_ptr(), v.storage_offset())
        if v.numel() and (key in seen or v.untyped_storage().nbytes() != v.nbytes):
            v = v.clone()  # tied, or a view into a larger storage
        seen.add((v.untyped_storage().data_ptr(), v.storage_offset()))
        out[k] = v
    return out


def _write_bytes(out: str, fill: Any) -> str:
    """Write ``out`` by calling ``fill(path)`` (local: to a part file renamed into place) or
    ``fill(None)`` returning the bytes (URL: one PUT)."""
    if is_url(out):
        import fsspec

        fs, path = fsspec.core.url_to_fs(out)
        parent = path.rsplit("/", 1)[0]
        fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(path, fill(None))
        return out
    target = Path(out)
    if target.is_dir():
        raise CheckpointError(f"{target} is a directory; expected the path of the file to write.")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        fill(part)
        with open(part, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return str(target)


def write_safetensors(tensors: Mapping[str, torch.Tensor], out: str,
                      metadata: Mapping[str, str]) -> str:
    """One safetensors file of ``tensors`` with string ``metadata``; returns where."""
    from safetensors.torch import save, save_file

    flat = _unshared(tensors)
    meta = dict(metadata)

    def fill(part: Path | None) -> bytes | None:
        if part is None:
            return save(flat, metadata=meta)
        save_file(flat, str(part), metadata=meta)
        return None

    return _write_bytes(out, fill)


def _rename_params(osd: Mapping[str, Any], prefix: str | None) -> dict[str, Any]:
    def short(n: str) -> str:
        return n[len(prefix):] if prefix and n.startswith(prefix) else n

    return {"state": {short(n): dict(s) for n, s in osd["state"].items()},
            "param_groups": [{**g, "params": [short(p) for p in g.get("params", [])]}
                             for g in osd["param_groups"]]}


def write_optimizer(osd: Mapping[str, Any], out: str, prefix: str | None = None) -> str:
    """The optimizer state by parameter name. ``.safetensors``: tensors named
    ``state.<param>.<key>``, with ``param_groups`` (and non-tensor state) as JSON metadata;
    otherwise ``torch.save`` of ``{"state": {param: {...}}, "param_groups": [...]}``, which
    loads with ``weights_only=True`` and feeds ``set_optimizer_state_dict`` as is."""
    named = _rename_params(osd, prefix)
    if out.endswith(".safetensors"):
        tensors, scalars = {}, {}
        for param, st in named["state"].items():
            for key, v in st.items():
                if isinstance(v, torch.Tensor):
                    tensors[f"state.{param}.{key}"] = v
                else:
                    scalars[f"state.{param}.{key}"] = v
        meta = {"format": "pt", "param_groups": json.dumps(named["param_groups"], default=str),
                "scalars": json.dumps(scalars, default=str)}
        return write_safetensors(tensors, out, meta)

    def fill(part: Path | None) -> bytes | None:
        buf = io.BytesIO()
        torch.save(named, buf)
        if part is None:
            return buf.getvalue()
        part.write_bytes(buf.getbuffer())
        return None

    return _write_bytes(out, fill)


def _candidates(transformers: Any, config: Any) -> list[type]:
    """The classes ``config`` may describe: the architecture it names, or, when it names
    none (``config.save_pretrained`` of a config no model saved), the auto classes' choices
    for its ``model_type``, language-model heads first."""
    names = list(getattr(config, "architectures", None) or [])[:1]
    if not names:
        from transformers.models.auto import modeling_auto as auto

        first = ("MODEL_FOR_CAUSAL_LM", "MODEL_FOR_MASKED_LM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM")
        maps = [*first, *sorted(m.removesuffix("_MAPPING_NAMES") for m in dir(auto)
                                if m.startswith("MODEL_FOR_") and m.endswith("_MAPPING_NAMES")),
                "MODEL"]
        for m in maps:
            found = getattr(auto, f"{m}_MAPPING_NAMES", {}).get(config.model_type)
            names += [found] if isinstance(found, str) else list(found or ())
    classes = [getattr(transformers, n, None) for n in dict.fromkeys(names)]
    return [c for c in classes if isinstance(c, type)]


def _fit(cls: type, config: Any, tensors: Mapping[str, torch.Tensor]
         ) -> tuple[list[str], set[str]]:
    """What keeps ``tensors`` from loading into ``cls(config)`` (empty: nothing), and the
    tied names save_pretrained would leave out of them."""
    with torch.device("meta"):
        model = cls(config)
    ref = model.state_dict(keep_vars=True)
    tied = getattr(model, "_tied_weights_keys", None) or ()
    drop = tied_duplicates(ref, tied)
    groups: dict[int, set[str]] = {}
    for k, v in ref.items():  # tied weights: one tensor, several names; one of them suffices
        groups.setdefault(id(v), set()).add(k)
    missing = sorted(k for k in ref if not groups[id(ref[k])] & set(tensors))
    unexpected = sorted(set(tensors) - set(ref))
    shapes = [f"{k} {tuple(tensors[k].shape)} vs {tuple(ref[k].shape)}" for k in sorted(ref)
              if k in tensors and tuple(tensors[k].shape) != tuple(ref[k].shape)]
    parts = [f"{what} ({len(names)}): {', '.join(names[:4])}{', ...' if len(names) > 4 else ''}"
             for what, names in (("missing", missing), ("unexpected", unexpected),
                                 ("shapes differ", shapes)) if names]
    return parts, drop & set(tensors)


def hf_mismatch(config_dir: Path, tensors: Mapping[str, torch.Tensor]
                ) -> tuple[str | None, set[str]]:
    """Why ``tensors`` would not load into the model ``config.json`` describes (None: they
    fit; also None when transformers or an architecture is not there to check with), and
    the tied names ``save_pretrained`` leaves out (written once, as it does)."""
    try:
        import transformers
    except ImportError:
        warnings.warn("transformers is not installed here: the parameter names were not "
                      f"checked against {config_dir}/config.json.", stacklevel=3)
        return None, set()
    config = transformers.AutoConfig.from_pretrained(str(config_dir), local_files_only=True)
    classes = _candidates(transformers, config)
    if not classes:
        warnings.warn(f"{config_dir}/config.json names no architecture transformers knows "
                      f"({getattr(config, 'architectures', None)}, model_type "
                      f"{getattr(config, 'model_type', None)!r}); the parameter names were "
                      "not checked against it.", stacklevel=3)
        return None, set()
    tried = []
    for cls in classes:
        parts, drop = _fit(cls, config, tensors)
        if not parts:
            return None, drop
        tried.append((cls.__name__, parts))
    if getattr(config, "architectures", None):  # the one it names: a real mismatch
        return f"the weights do not fit {tried[0][0]} of {config_dir}: " + "; ".join(
            tried[0][1]), set()
    warnings.warn(f"the weights fit none of {[n for n, _ in tried]}, the classes transformers "
                  f"has for model_type {config.model_type!r} ({config_dir}/config.json names "
                  "no architecture); they were not checked further.", stacklevel=3)
    return None, set()


def write_hf(tensors: Mapping[str, torch.Tensor], out: str, config_dir: str,
             metadata: Mapping[str, str]) -> tuple[str, set[str]]:
    """A folder ``from_pretrained`` loads: ``config_dir``'s files (config, tokenizer,
    generation config; no weights) plus ``model.safetensors``, tied weights once. Returns
    the weights' path and the tied names left out."""
    src = Path(config_dir)
    if not (src / "config.json").is_file():
        raise CheckpointError(f"--hf {src}: expected a folder with a config.json (as "
                              "save_pretrained or the model's hub page provides).")
    if is_url(out):
        raise CheckpointError(f"{out}: --hf writes a local folder; convert to a local path and "
                              "upload the folder.")
    why, tied = hf_mismatch(src, tensors)
    if why:
        raise CheckpointError(why + ". Pick the model with --model, or remove a wrapper's "
                              "prefix with --strip-prefix.")
    dst = Path(out)
    if dst.exists() and not dst.is_dir():
        raise CheckpointError(f"{dst} is a file; with --hf, OUT is the folder to write.")
    dst.mkdir(parents=True, exist_ok=True)
    stale = sorted(p.name for p in dst.iterdir() if p.name != HF_WEIGHTS and
                   p.name.endswith(WEIGHT_SUFFIXES))
    if stale:
        raise CheckpointError(f"{dst} already holds weights {stale}, which from_pretrained "
                              "would mix with the new ones; choose an empty folder.")
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and f.resolve() != (
                dst / f.name).resolve():
            shutil.copyfile(f, dst / f.name)
    once = {k: v for k, v in tensors.items() if k not in tied}  # as save_pretrained writes
    return write_safetensors(once, str(dst / HF_WEIGHTS), metadata), tied
