"""RNG states: captured and restored with a checkpoint, kept across one-off work, and set
after a resume when the next training step starts.

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
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from splitsync.distributed.seeding import Generators

__all__ = ["capture_rng", "restore_rng", "kept_rng", "RngArrival"]


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


@contextlib.contextmanager
def kept_rng() -> Iterator[None]:
    """Global generators (Python, NumPy if imported, torch CPU) as they were before: for
    splitsync's own work on one rank that may draw (a library opened on first use), so a
    script's draws never depend on when that work happened."""
    python, cpu = random.getstate(), torch.get_rng_state()
    np = sys.modules.get("numpy")
    numpy_state = np.random.get_state() if np is not None else None
    try:
        yield
    finally:
        random.setstate(python)
        torch.set_rng_state(cpu)
        if numpy_state is not None:
            np.random.set_state(numpy_state)


class RngArrival:
    """One resume's global RNG states, waiting for the next training step to start (a
    watch of ``run.backward``/``run.step``: an observer by its hooks' names, a forward
    pre-hook, a loader's first batch)."""

    def __init__(self, state: Mapping[str, Any], generators: Generators | None,
                 models: Mapping[str, Any], hooks: Any,
                 watch: Callable[[Any], Any] | None,
                 unwatch: Callable[[Any], None] | None) -> None:
        if generators is not None:  # the run's own streams: at once
            generators.restore(state.get("generators", {}))
        self.state: Mapping[str, Any] | None = {k: v for k, v in state.items()
                                                if k != "generators"}
        self._hooks = hooks  # the run's LoaderHooks (None: no loader to tell)
        self._unwatch = unwatch
        self._handles = []
        ids = {id(m) for m in models.values()}

        def at_forward(module: Any, args: Any) -> None:
            # a plain function, which deepcopy shares: an EMA copied from a hooked model
            # copies the hook, not this object; its forward is no training step
            if id(module) in ids:
                self.arrive()

        for module in models.values():
            hook = at_forward
            if getattr(module, "_compiled_call_impl", None) is not None:
                import torch._dynamo  # its forward, hooks included, runs compiled

                hook = torch._dynamo.disable(hook)
            self._handles.append(module.register_forward_pre_hook(hook, prepend=True))
        if hooks is not None:
            hooks.arrival = self.arrive
        if watch is not None:
            watch(self)

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

    def on_backward(self, loss: Any, loader: Any, count: Any = None) -> None:
        self.arrive()

    def on_step_begin(self, optimizer: Any) -> None:
        self.arrive()
