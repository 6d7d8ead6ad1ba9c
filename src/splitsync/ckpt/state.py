"""Collecting and restoring training state in forms that load with ``weights_only=True``."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.store import CheckpointError
from splitsync.data.build import ResumableLoader
from splitsync.distributed.seeding import Generators

__all__ = [
    "capture_rng", "restore_rng", "loader_position", "restore_loader", "check_shapes",
    "owner_of",
]


# --- RNG ---------------------------------------------------------------------------------
def capture_rng(generators: Generators | None = None) -> dict[str, Any]:
    """This process's python, numpy, torch and CUDA generator states (plain containers), and
    the run's per-rank ``run.generator`` streams."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if generators is not None and generators.streams:  # none made: nothing to capture
        state["generators"] = generators.capture(per_rank=True)
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


def restore_rng(state: Mapping[str, Any], generators: Generators | None = None) -> None:
    """Inverse of :func:`capture_rng`."""
    if generators is not None:
        generators.restore(state.get("generators", {}))
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


# --- loaders (through the protocol both kinds share: splitsync.data.build.ResumableLoader) ---
def loader_position(loader: ResumableLoader) -> tuple[dict[str, Any], torch.Tensor | None]:
    """Where ``loader`` continues from (collective for streams), and this rank's generator
    state that goes with it."""
    return loader.position(), loader.rng_state()


def restore_loader(loader: ResumableLoader, pos: Mapping[str, Any],
                   generator_state: torch.Tensor | None) -> None:
    """Make ``loader`` continue at ``pos``; a position of the other kind is refused."""
    try:
        loader.restore(pos, generator_state)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None


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
