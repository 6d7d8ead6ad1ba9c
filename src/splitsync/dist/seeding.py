"""Seeds: the same on every rank for model init, distinct per rank and worker for data."""

from __future__ import annotations

import random

import torch

__all__ = ["seed_everything", "worker_init_fn", "draw_seed"]

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
