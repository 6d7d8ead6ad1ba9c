"""The run's data part: the loaders it made, the hooks they call, and ``run.epochs``.

``run.loader`` builds through :func:`splitsync.data.build.make_loader`, which decides what
the data gets; the loaders report back through :attr:`Loaders.hooks` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from splitsync.data.build import ResumableLoader
from splitsync.data.loader import LoaderHooks, direct
from splitsync.observe import Observer, chain_around, overriding

__all__ = ["Loaders"]


class Loaders:
    """Loaders made by ``run.loader`` (in order), their hooks, and which one is active."""

    def __init__(self) -> None:
        self.all: list[ResumableLoader] = []
        self.hooks = LoaderHooks()
        self._epochs: tuple[Observer, ...] = ()
        self._on_epoch: tuple[Observer, ...] = ()
        self._final = False  # run.epochs is in its last epoch
        self.on_end: Callable[[], None] | None = None  # called when run.epochs runs out

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
        try:
            for epoch in range(start, n):
                for loader in self.all:
                    loader.set_epoch(epoch)
                for obs in self._on_epoch:
                    obs.on_epoch(epoch)
                self._final = epoch == n - 1
                yield epoch
        finally:  # also when the loop is left early (break): no later batch ends the run
            self._final = False
        if self.on_end is not None:
            self.on_end()

    def run_ends(self) -> bool:
        """Whether the batch under way is the run's last: the last batch of the last epoch
        of ``run.epochs``, where its loader knows it (map-style loaders; streams that stop
        where the first rank runs out)."""
        if not self._final:
            return False
        active = self.hooks.active
        return active is not None and bool(active.last_batch)
