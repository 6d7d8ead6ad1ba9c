"""The global RNG states a resume read, set when the next training step starts.

``run.resume`` reads Python's ``random``, NumPy's, torch's CPU and CUDA generator states,
but sets them only at the first of: a loader's first batch, a forward of a model it
registered, ``run.backward`` or ``run.step``. Whatever runs in between (a lazy import that
draws, as rich's does at import; an evaluation; a tracker opening; the script's own setup)
then draws from the fresh seed and leaves the restored sequence untouched, so the step
after a resume draws exactly what it drew in the run never stopped. A save before that
moment writes the states read, as they will be set. ``run.generator`` streams are the
run's own and are restored at once (a script may draw its batch from one before any
forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from splitsync.ckpt.state import capture_rng, restore_rng
from splitsync.observe import Observer

__all__ = ["RngArrival"]


class RngArrival(Observer):
    """One resume's global RNG states, waiting for the next training step to start (a
    watch of ``run.backward``/``run.step``, a forward pre-hook, a loader's first batch)."""

    def __init__(self, state: Mapping[str, Any], models: Mapping[str, Any], hooks: Any,
                 watch: Callable[[Observer], Any] | None,
                 unwatch: Callable[[Observer], None] | None) -> None:
        self.state: Mapping[str, Any] | None = {k: v for k, v in state.items()
                                                if k != "generators"}
        self._hooks = hooks  # the run's LoaderHooks (None: no loader to tell)
        self._unwatch = unwatch
        self._handles = []
        for module in models.values():
            hook = self._at_forward
            if getattr(module, "_compiled_call_impl", None) is not None:
                import torch._dynamo  # its forward, hooks included, runs compiled

                hook = torch._dynamo.disable(hook)
            self._handles.append(module.register_forward_pre_hook(hook, prepend=True))
        if hooks is not None:
            hooks.arrival = self.arrive
        if watch is not None:
            watch(self)

    @property
    def pending(self) -> bool:
        return self.state is not None

    def arrive(self) -> None:
        """Set the states now (once) and stop listening."""
        state, self.state = self.state, None
        self.disarm()
        if state is not None:
            restore_rng(state)

    def disarm(self) -> None:
        """Stop listening (the states, if not set yet, are dropped by whoever calls this)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._hooks is not None and self._hooks.arrival == self.arrive:
            self._hooks.arrival = None
        if self._unwatch is not None:
            self._unwatch(self)
            self._unwatch = None

    @contextlib.contextmanager
    def as_set(self) -> Iterator[None]:
        """For a save before the states are set: the generators hold them meanwhile."""
        if self.state is None:
            yield
            return
        now = capture_rng()
        restore_rng(self.state)
        try:
            yield
        finally:
            restore_rng(now)

    def _at_forward(self, module: Any, args: Any) -> None:
        self.arrive()

    def on_backward(self, loss: Any, loader: Any, count: Any = None) -> None:
        self.arrive()

    def on_step_begin(self, optimizer: Any) -> None:
        self.arrive()
