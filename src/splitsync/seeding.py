"""Seeds: the same on every rank for model init, distinct per rank and worker for data."""

from __future__ import annotations

import random

import torch

__all__ = ["seed_everything", "worker_init_fn", "draw_seed", "capture_rng", "restore_rng"]

_MAX_SEED = 2**32 - 1


def draw_seed() -> int:
    """A fresh random seed (rank 0 draws, then broadcasts it)."""
    return random.SystemRandom().randint(0, _MAX_SEED)


def seed_everything(seed: int) -> None:
    """Seed python, numpy (if installed), torch and every accelerator."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds all CUDA devices lazily
    try:
        import numpy as np
    except ImportError:  # numpy is optional
        return
    np.random.seed(seed % (_MAX_SEED + 1))


def worker_init_fn(worker_id: int) -> None:
    """DataLoader worker seeding: torch already gives each worker base_seed + id.

    The base seed differs per rank because the loader's generator is seeded with
    (seed, rank); here python and numpy follow torch's per-worker seed.
    """
    seed = torch.initial_seed() % (_MAX_SEED + 1)
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        return
    np.random.seed(seed)


def capture_rng() -> dict[str, object]:
    """RNG states of python, numpy, torch and cuda, as tensors and plain objects."""
    state: dict[str, object] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, object]) -> None:
    """Inverse of :func:`capture_rng`."""
    random.setstate(state["python"])  # type: ignore[arg-type]
    torch.set_rng_state(state["torch"])  # type: ignore[arg-type]
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])  # type: ignore[arg-type]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])  # type: ignore[arg-type]
