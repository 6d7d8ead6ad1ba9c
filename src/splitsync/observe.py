"""The observer protocol: how the core reports what a run does to whoever listens.

A tool (a script recorder, the runtime guards, a profiler, a metrics tracker) subclasses
:class:`Observer`, overrides the hooks it needs and is registered with
``run.add_observer(obs)``. The core holds a list of observers and knows none of them by name.
Every default is a no-op, and the run calls only the hooks a subclass overrides: with no
observer overriding ``on_backward``, a backward costs exactly what it costs without any.

Hooks run in registration order, except :meth:`Observer.on_close`, which runs in reverse
(the last tool attached is the first torn down).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch
    from torch import nn

    from splitsync.data.loader import DeviceLoader

__all__ = ["Observer", "overriding", "chain_around", "appended", "redirect"]

T = TypeVar("T")


class Observer:
    """Base class for run observers; override only what you need."""

    # --- model -------------------------------------------------------------------------
    def on_model(self, module: nn.Module) -> None:
        """``run.model``: the user's module on the run's device, before any wrapper."""

    def on_wrapped(self, model: nn.Module) -> nn.Module:
        """``run.model``: the wrapped model about to be returned; return it (or a model
        whose forward is wrapped, e.g. by a guard)."""
        return model

    # --- data --------------------------------------------------------------------------
    def loader_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``run.loader``: the DataLoader arguments, which an observer may adjust."""
        return kwargs

    def on_loader_iter(self, loader: DeviceLoader) -> None:
        """A loader made by ``run.loader`` starts a pass."""

    def epochs(self, start: int, stop: int) -> int:
        """``run.epochs(stop, start)``: the epoch to stop before (may be smaller)."""
        return stop

    def on_epoch(self, epoch: int) -> None:
        """An epoch of ``run.epochs`` begins (loaders' ``set_epoch`` already called)."""

    # --- training ----------------------------------------------------------------------
    def on_backward(self, loss: torch.Tensor, loader: DeviceLoader | None) -> None:
        """``run.backward(loss)``, before the backward pass; ``loader`` is the active one."""

    def on_step_begin(self, optimizer: torch.optim.Optimizer) -> None:
        """``run.step``, before it (gradients are final here when it steps:
        ``run.sync_gradients``)."""

    def on_step_end(self, optimizer: torch.optim.Optimizer,
                    norm: torch.Tensor | None) -> None:
        """``run.step``, after it; ``norm`` is the clipped gradient norm or None."""

    def around_collective(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        """Wrap one collective (``run.mean/sum/max/gather/broadcast/barrier``, and the
        gradient all-reduce of ``run.backward`` when world_size > 1). Must call ``fn`` (or
        run an equivalent collective) and return its result. A checkpoint's handshakes come
        here too: ``all_gather_object`` from ``run.save``, and ``gather_object`` and
        ``broadcast`` from a background save's own thread, on a group of their own."""
        return fn(*args)

    # --- output and lifecycle ----------------------------------------------------------
    def log_extra(self) -> Sequence[float]:
        """``run.log`` with metrics, on every rank before its all-reduce: numbers to average
        in that same collective (as many on every rank). Their means go to
        :meth:`on_log_extra`; riding along costs no collective of its own."""
        return ()

    def on_log_extra(self, means: list[float]) -> None:
        """``run.log``, on every rank: the means of what :meth:`log_extra` gave."""

    def redirect_path(self, path: Path) -> Path:
        """Where the run writes a file or directory the script named (``run.resume``/
        ``run.save`` checkpoint directories, ``run.export``, ``init(run_dir=...)``); a
        tool that sandboxes a run returns a path of its own. Default: ``path``."""
        return path

    def on_log(self, record: Mapping[str, int | float]) -> None:
        """``run.log``: the metrics averaged over ranks."""

    def on_save(self, path: Path, step: int) -> None:
        """``run.save``: a checkpoint was committed at ``path``."""

    def on_close(self, clean: bool) -> None:
        """``run.close``; ``clean`` is False when the run ends on an exception."""


def overriding(observers: Iterable[Observer], hook: str) -> tuple[Observer, ...]:
    """The observers whose class overrides ``hook`` (the only ones worth calling)."""
    base = getattr(Observer, hook)
    return tuple(o for o in observers if getattr(type(o), hook, base) is not base)


def chain_around(observers: Iterable[Observer]) -> Callable[..., Any] | None:
    """One ``call(op, fn, *args)`` running ``fn`` inside every observer's
    ``around_collective`` (the first registered outermost); None when none overrides it."""
    chain = overriding(observers, "around_collective")
    if not chain:
        return None
    if len(chain) == 1:
        return chain[0].around_collective
    outer = chain[0].around_collective
    inner = [o.around_collective for o in reversed(chain[1:])]

    def call(op: str, fn: Callable[..., Any], *args: Any) -> Any:
        # C-level partials, no closure of ours per layer: this runs on every backward
        for around in inner:
            fn = partial(around, op, fn)
        return outer(op, fn, *args)

    return call


def appended(observers: tuple[Observer, ...], observer: Any) -> tuple[Observer, ...]:
    """``observers`` with ``observer`` at the end; anything else is refused by name."""
    if not isinstance(observer, Observer):
        raise TypeError(f"run.add_observer() takes a splitsync.observe.Observer, got "
                        f"{type(observer).__name__}.")
    return (*observers, observer)


def redirect(observers: Iterable[Observer], path: Path) -> Path:
    """``path`` after every observer's :meth:`Observer.redirect_path`, in order."""
    for obs in observers:
        path = obs.redirect_path(path)
    return path
