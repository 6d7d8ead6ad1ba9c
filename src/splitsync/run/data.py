"""The run's data part: the loaders it made, the hooks they call, and ``run.epochs``.

``run.loader`` builds through :func:`splitsync.data.build.make_loader`, which decides what
the data gets; the loaders report back through :attr:`Loaders.hooks` alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from splitsync.data.build import LoaderHooks, ResumableLoader, direct
from splitsync.observe import Observer, chain_around, overriding

__all__ = ["Loaders"]


class Loaders:
    """Loaders made by ``run.loader`` (in order), their hooks, and which one is active."""

    def __init__(self) -> None:
        self.all: list[ResumableLoader] = []
        self.hooks = LoaderHooks()
        self._epochs: tuple[Observer, ...] = ()
        self._on_epoch: tuple[Observer, ...] = ()

    @property
    def active(self) -> Any:
        """The loader whose pass is under way (None before the first)."""
        return self.hooks.active

    def set_observers(self, observers: Sequence[Observer]) -> None:
        hooks = self.hooks  # one object shared with every loader: they see the change
        hooks.adjust = overriding(observers, "loader_kwargs")
        hooks.on_iter = overriding(observers, "on_loader_iter")
        hooks.on_batch = overriding(observers, "on_batch")
        hooks.on_stream_batch = overriding(observers, "on_stream_batch")
        hooks.collective = chain_around(observers) or direct
        self._epochs = overriding(observers, "epochs")
        self._on_epoch = overriding(observers, "on_epoch")

    def epochs(self, n: int, start: int = 0) -> Iterator[int]:
        """Yield epoch numbers start..n-1, calling set_epoch on every loader first."""
        for obs in self._epochs:
            n = obs.epochs(start, n)
        for epoch in range(start, n):
            for loader in self.all:
                loader.set_epoch(epoch)
            for obs in self._on_epoch:
                obs.on_epoch(epoch)
            yield epoch
