"""Sharded (DCP) checkpoints read whole in one process, without a process group.

torch.distributed.checkpoint's own offline path (``dcp_to_torch_save``,
``_load_state_dict_from_keys``) rebuilds the full state from the metadata with
``_EmptyStateDictLoadPlanner`` and reads it with ``FileSystemReader`` -- but unpickles the
metadata with plain ``pickle`` and non-tensor values with ``weights_only=False``. The same
planner and loader are used here with splitsync's safe metadata reader and a value loader
that is ``weights_only=True``: a forged payload is refused, never run.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from splitsync.ckpt.sharded import DCP_DIR, safe_reader
from splitsync.errors import CheckpointError

__all__ = ["metadata", "read_keys", "tensor_entries"]


def metadata(step_dir: Path) -> Any:
    """DCP's ``Metadata`` of the checkpoint in ``step_dir`` (read without unrestricted pickle)."""
    where = step_dir / DCP_DIR / ".metadata"
    try:
        return safe_reader(step_dir / DCP_DIR).read_metadata()
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{where}: refused to unpickle it ({e}); it holds objects that "
                              "could run code. Only read checkpoints you trust.") from None
    except (OSError, EOFError, ValueError) as e:
        raise CheckpointError(f"{where} is unreadable ({type(e).__name__}: {e})") from None


def tensor_entries(md: Any, prefix: tuple[str, ...]) -> dict[tuple[Any, ...], Any]:
    """``{object path: TensorStorageMetadata}`` of the tensors under ``prefix`` (e.g.
    ``("model", "net")``), paths relative to it: sizes and dtypes without reading data."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    out = {}
    for key, meta in md.state_dict_metadata.items():
        path = tuple(md.planner_data.get(key, (key,))) if md.planner_data else (key,)
        if path[:len(prefix)] == prefix and isinstance(meta, TensorStorageMetadata):
            out[path[len(prefix):]] = meta
    return out


def _planner(keys: set[str]) -> Any:
    try:
        from torch.distributed.checkpoint._traverse import set_element
        from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    except ImportError as e:  # private to torch: say which piece moved
        raise CheckpointError(f"this torch ({torch.__version__}) lacks the offline reader of "
                              f"torch.distributed.checkpoint ({e})") from None

    class _SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        """Rebuilds the saved state from the metadata; non-tensor values: plain data only."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict,
                            self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return _SafeEmptyPlanner(keys=keys)


def read_keys(step_dir: Path, keys: Iterable[str]) -> dict[str, Any]:
    """The saved state under each dotted prefix in ``keys`` (e.g. ``"model.net"``), unsharded
    and nested as it was saved (``{"model": {"net": {fqn: tensor}}}``), in this process."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    wanted = set(keys)
    sd: dict[str, Any] = {}
    try:
        _load_state_dict(sd, storage_reader=safe_reader(step_dir / DCP_DIR),
                         planner=_planner(wanted), no_dist=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{step_dir / DCP_DIR}: refused to unpickle a value ({e}); it "
                              "holds objects that could run code.") from None
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # DCP's wrapper is a BaseException
        raise CheckpointError(f"{step_dir / DCP_DIR}: reading {sorted(wanted)} failed "
                              f"({type(e).__name__}: {e})") from None
    return sd
