"""Collecting and restoring training state in forms that load with ``weights_only=True``."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.store import CheckpointError
from splitsync.data.loader import DeviceLoader
from splitsync.data.stream.loader import StreamLoader

__all__ = [
    "capture_rng", "restore_rng", "loader_position", "restore_loader", "check_shapes",
    "owner_of",
]


# --- RNG ---------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """This process's python, numpy, torch and CUDA generator states (plain containers)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        np = None  # type: ignore[assignment]
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        # numpy arrays need pickle's globals; a tensor copy loads under weights_only.
        state["numpy"] = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        torch.cuda.set_rng_state_all(states[: torch.cuda.device_count()])


# --- loaders -----------------------------------------------------------------------------
def loader_position(loader: DeviceLoader | StreamLoader
                    ) -> tuple[dict[str, Any], torch.Tensor | None]:
    """(epoch, global positions consumed) to continue from, and the generator state to restore.

    Mid-pass the generator is restored to its state *before* the pass began, so the resumed
    iterator draws the same worker base seed as the interrupted one did.
    """
    if isinstance(loader, StreamLoader):  # a stream: per-shard positions (collective)
        return loader.position(), None
    s = loader.sampler
    epoch = s.epoch if s is not None else 0
    gen = loader.loader.generator
    now = gen.get_state() if gen is not None else None
    if loader.pass_epoch != epoch or loader.batches_seen == 0:  # this epoch not begun yet
        return {"epoch": epoch, "consumed": s.start if s is not None else 0}, now
    if loader.batches_seen >= len(loader):  # epoch finished: continue at the next one
        return {"epoch": epoch + 1, "consumed": 0}, now
    return {"epoch": epoch, "consumed": loader.consumed()}, loader.pass_generator_state


def restore_loader(loader: DeviceLoader | StreamLoader, pos: Mapping[str, Any],
                   generator_state: torch.Tensor | None) -> None:
    """Make ``loader`` continue at ``pos``: positions already consumed are skipped by index."""
    if isinstance(loader, StreamLoader):
        if "offsets" not in pos:
            raise CheckpointError("the checkpoint holds an indexed loader's position where "
                                  "this run made a stream loader; make loaders in the same order.")
        loader.resume_at(dict(pos))
        return
    if "offsets" in pos:
        raise CheckpointError("the checkpoint holds a stream loader's position where this run "
                              "made an indexed loader; make loaders in the same order.")
    s = loader.sampler
    if s is None:
        raise CheckpointError(
            "cannot resume a loader without splitsync's ShardSampler; build it with run.loader().")
    s.resume_at(int(pos["epoch"]), int(pos["consumed"]))
    gen = loader.loader.generator
    if gen is not None and generator_state is not None:
        gen.set_state(generator_state)


# --- models and optimizers ----------------------------------------------------------------
def check_shapes(name: str, saved: Mapping[str, Sequence[int]],
                 current: Mapping[str, Sequence[int]], where: str) -> None:
    """Raise naming the first key whose presence or shape differs (nothing is loaded)."""
    for key in sorted(set(saved) | set(current)):
        if key not in current:
            raise CheckpointError(f"checkpoint {where} does not fit {name!r}: it has {key!r} "
                                  f"(shape {tuple(saved[key])}), which the model lacks")
        if key not in saved:
            raise CheckpointError(f"checkpoint {where} does not fit {name!r}: the model's "
                                  f"{key!r} (shape {tuple(current[key])}) is not in it")
        if tuple(saved[key]) != tuple(current[key]):
            raise CheckpointError(
                f"checkpoint {where} does not fit {name!r}: {key!r} has shape "
                f"{tuple(saved[key])} in the checkpoint but {tuple(current[key])} in the model")


def owner_of(optimizer: torch.optim.Optimizer, models: Mapping[str, nn.Module]) -> str:
    """The registered model holding every parameter of ``optimizer``."""
    params = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for name, m in models.items():
        if params <= {id(p) for p in m.parameters()}:
            return name
    raise CheckpointError("an optimizer's parameters do not all belong to one registered model; "
                          "pass the model that owns them to run.resume(...) as well.")
