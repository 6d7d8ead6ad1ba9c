"""Sharded (DTensor / FSDP2) model and optimizer state through torch.distributed.checkpoint.

Each rank writes its own shards; loading reshards, so a checkpoint saved by N ranks loads
into M ranks or into an ordinary module. Two of DCP's readers would otherwise unpickle
arbitrary data: the ``.metadata`` file and non-tensor values. Here the metadata goes through
an unpickler that only builds DCP's own metadata classes, and values load with
``weights_only=True``; both refuse a payload instead of running it.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.state import (
    check_shapes,
    load_model_state,
    load_optimizer_state,
    model_state,
    optimizer_state,
    state_shapes,
)
from splitsync.errors import CheckpointError

__all__ = ["DCP_DIR", "sharded_state", "write_sharded", "load_sharded", "safe_reader",
           "read_shapes"]

DCP_DIR = "dcp"
_ALLOWED_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
    "torch.distributed.checkpoint._extension",
)
_ALLOWED_TORCH = {"Size", "device", "dtype", "layout", "memory_format"}
_ALLOWED_EXACT = {
    ("torch.serialization", "_get_layout"),  # looks a layout up by name
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only DCP metadata classes and torch's plain types; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _ALLOWED_MODULES or (module == "torch" and name in _ALLOWED_TORCH) or (
                (module, name) in _ALLOWED_EXACT) or (
                module == "builtins" and name in {"set", "frozenset", "tuple", "list", "dict"}):
            return super().find_class(module, name)
        if module == "torch" and (name.endswith("Storage") or isinstance(
                getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"checkpoint metadata refers to {module}.{name}, which is not checkpoint metadata; "
            "refused to load it (it could run code).")


def safe_reader(path: Path) -> Any:
    """A FileSystemReader whose metadata is read without unrestricted pickle."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            md_path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(md_path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _SafeReader(path)


def _safe_planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class _SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)  # non-tensor values: plain data only
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                            obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return _SafePlanner()


def _dist_active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def sharded_state(models: Mapping[str, nn.Module],
                  optims: Mapping[str, tuple[torch.optim.Optimizer, str]],
                  template: bool = False) -> dict[str, Any]:
    """This rank's shards of every model and optimizer (DTensors, live: not copies);
    ``template``: to load into (optimizer states are made where missing)."""
    return {
        "model": {n: model_state(m, full=False, offload=False) for n, m in models.items()},
        "optim": {n: optimizer_state(models[owner], o, full=False, offload=False,
                                     template=template)
                  for n, (o, owner) in optims.items()},
    }


def write_sharded(path: Path, state: Mapping[str, Any], group: Any = None) -> None:
    """Collective on ``group`` (default: the training group): every rank writes its shards
    of ``state`` (live, or staged by :class:`~splitsync.ckpt.staging.Stager`) under
    ``path``. Works for DTensors on any mesh: DCP plans from their placements alone."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    save(dict(state), storage_writer=FileSystemWriter(path / DCP_DIR, sync_files=True),
         process_group=group, no_dist=not _dist_active())


def read_shapes(path: Path, prefix: str) -> dict[str, tuple[int, ...]]:
    """Global shapes of the tensors saved under ``prefix`` (e.g. ``model.net.``)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        md = safe_reader(path / DCP_DIR).read_metadata()
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path / DCP_DIR / '.metadata'}: {e}") from None
    return {k[len(prefix):]: tuple(v.size) for k, v in md.state_dict_metadata.items()
            if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)}


def load_sharded(path: Path, models: Mapping[str, nn.Module],
                 optims: Mapping[str, tuple[torch.optim.Optimizer, str]]) -> None:
    """Collective: reshard the saved state into the current models (sharded or not)."""
    from torch.distributed.checkpoint import load

    for name, m in models.items():  # check every shape before anything is loaded
        check_shapes(name, read_shapes(path, f"model.{name}."), state_shapes(m), path.name)
    sd = sharded_state(models, optims, template=True)
    try:
        load(sd, storage_reader=safe_reader(path / DCP_DIR), planner=_safe_planner(),
             no_dist=not _dist_active())
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: refused to unpickle a value ({e})") from None
    for name, m in models.items():
        load_model_state(m, sd["model"][name], full=False)
    for name, (o, owner) in optims.items():
        load_optimizer_state(models[owner], o, sd["optim"][name], full=False)
