"""Seeds: the same on every rank for model init, distinct per rank and worker for data."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping

import torch

__all__ = ["seed_everything", "worker_init_fn", "draw_seed", "loader_seed", "stream_seed",
           "Generators"]

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


def loader_seed(seed: int, rank: int) -> int:
    """The seed of a loader's generator on ``rank``: the base its workers' seeds derive from
    (torch gives worker w ``base + w``), so workers differ per rank and are reproducible."""
    return seed * 1000003 + rank


def stream_seed(seed: int, rank: int | None, name: str) -> int:
    """The seed of ``run.generator(name)``: from (seed, rank), or (seed) alone when shared
    (``rank`` None). Hashed, so neighbouring ranks and names give unrelated streams."""
    key = f"{seed}:{'shared' if rank is None else rank}:{name}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


class Generators:
    """The run's named ``torch.Generator`` streams (``run.generator``), their states saved
    with every checkpoint: per-rank ones in each rank's file, shared ones once."""

    def __init__(self, seed: int, rank: int) -> None:
        self.seed = seed
        self.rank = rank
        #: name -> (generator, per_rank): the streams made so far
        self.streams: dict[str, tuple[torch.Generator, bool]] = {}
        self._pending: dict[str, torch.Tensor] = {}  # restored before the stream was made

    def get(self, name: str, per_rank: bool, device: torch.device) -> torch.Generator:
        """The stream ``name``, made on first use (and set to a restored state, if any)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"run.generator(name={name!r}): give a non-empty string.")
        if name in self.streams:
            gen, was = self.streams[name]
            if was != per_rank:
                raise ValueError(
                    f"run.generator(name={name!r}) was made with per_rank={was}; the same "
                    "stream cannot change. Give the other one its own name=.")
            if gen.device.type != device.type or device.index not in (None, gen.device.index):
                raise ValueError(f"run.generator(name={name!r}) lives on {gen.device}, not "
                                 f"{device}; give a stream on another device its own name=.")
            return gen
        gen = torch.Generator(device=device)
        gen.manual_seed(stream_seed(self.seed, self.rank if per_rank else None, name))
        pending = self._pending.pop(name, None)
        if pending is not None:
            gen.set_state(pending)
        self.streams[name] = (gen, per_rank)
        return gen

    def capture(self, per_rank: bool) -> dict[str, torch.Tensor]:
        """States of the per-rank (or the shared) streams, by name."""
        return {n: g.get_state() for n, (g, pr) in self.streams.items() if pr == per_rank}

    def restore(self, states: Mapping[str, torch.Tensor]) -> None:
        """Set the streams to ``states``; a stream made later starts from its saved state."""
        for name, state in states.items():
            if name in self.streams:
                self.streams[name][0].set_state(state)
            else:
                self._pending[name] = state


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
