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

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch
    from torch import nn

    from splitsync.data.loader import DeviceLoader

__all__ = ["Observer", "overriding", "chain_around", "appended", "redirect", "step_end_calls",
           "backward_calls"]

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

    def on_batch(self, loader: Any, ids: list[int]) -> None:
        """A loader made by ``run.loader`` yields a batch; ``ids`` (one per sample, in batch
        order) say which samples it holds: dataset indices for an indexable dataset (padded
        repeats included), ``shard * 2**40 + position`` in the shard's epoch order for a
        stream (``splitsync.data.stream.sample_id``). Overriding it costs every batch of
        every loader a call; see :meth:`on_stream_batch` for a cheaper way."""

    def on_stream_batch(self, loader: Any, ids: list[int]) -> None:
        """A stream loader made by ``run.loader`` yields a batch (``ids`` as for
        :meth:`on_batch`). Map-style loaders never call it: which samples one of their
        passes delivered is known afterwards, without per-batch work, from the
        ``loader.sampler.pass_order()`` read when the pass begins (``on_loader_iter``) and
        the batches it yielded (``loader.batches_seen``; ``loader.previous_pass_batches``
        once the next pass has begun, ``loader.passes`` counting the passes begun): batch
        k holds the pass's positions
        ``k * batch_size`` to ``(k + 1) * batch_size``. Override this instead of
        :meth:`on_batch` to hear only the ids that cannot be known that way."""

    def epochs(self, start: int, stop: int) -> int:
        """``run.epochs(stop, start)``: the epoch to stop before (may be smaller)."""
        return stop

    def on_epoch(self, epoch: int) -> None:
        """An epoch of ``run.epochs`` begins (loaders' ``set_epoch`` already called)."""

    # --- training ----------------------------------------------------------------------
    def on_backward(self, loss: torch.Tensor, loader: DeviceLoader | None,
                    count: float | None = None) -> None:
        """``run.backward(loss)``, before the backward pass; ``loader`` is the active one.
        ``count``: the items ``loss`` is the mean of, under ``run.backward(loss, count=n)``
        (an override that takes only ``(loss, loader)`` is called that way)."""

    def on_step_begin(self, optimizer: torch.optim.Optimizer) -> None:
        """``run.step``, before it (gradients are final here when it steps:
        ``run.sync_gradients``)."""

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        """``run.step``, after it; ``norm`` is the clipped gradient norm or None. ``stepped``
        is False when the optimizer did not step: a micro-step inside an accumulation window,
        or a step the GradScaler skipped for inf/nan gradients. An override that takes only
        ``(optimizer, norm)`` still works: it is called that way, after every ``run.step``."""

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

    def after_resume(self, state: Any) -> None:
        """``run.resume`` returns ``state`` (a ``ResumeState``): where the run continues,
        also when no checkpoint was found (``state.resumed`` False: a fresh start at 0)."""

    def before_save(self, step: int | None) -> None:
        """``run.save`` is about to write a checkpoint (``step``: the one it was given, None
        for the run's own count): the moment to flush anything the checkpoint must not
        outrun."""

    def on_save(self, path: Path, step: int) -> None:
        """``run.save``: a checkpoint was committed at ``path``."""

    def on_save_staged(self, step: int) -> None:
        """``run.save(blocking=False)`` returns: its state is staged and the write goes on in
        the background (:meth:`on_save` follows once it has committed)."""

    def on_resume(self, path: Path | str, step: int) -> None:
        """``run.resume``: the checkpoint at ``path`` (``step`` optimizer steps done) was
        loaded. Not called when there was none to load."""

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


def _takes(hook: Callable[..., Any], name: str) -> bool:
    """Whether an override accepts the argument ``name`` (the signature of today)."""
    try:
        params = inspect.signature(hook).parameters
    except (TypeError, ValueError):  # a builtin or C callable: assume today's signature
        return True
    return name in params or any(
        p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())


def step_end_calls(observers: Iterable[Observer]) -> tuple[Callable[..., Any], ...]:
    """One ``call(optimizer, norm, stepped)`` per observer overriding ``on_step_end``.

    An override written for the older ``(optimizer, norm)`` signature is called without
    ``stepped`` (and, as before, after every ``run.step``); checked once, when observers
    change, never per step.
    """
    calls: list[Callable[..., Any]] = []
    for obs in overriding(observers, "on_step_end"):
        hook = obs.on_step_end
        if _takes(hook, "stepped"):
            calls.append(hook)
        else:
            calls.append(partial(_old_step_end, hook))
    return tuple(calls)


def backward_calls(observers: Iterable[Observer]) -> tuple[Callable[..., Any], ...]:
    """One ``call(loss, loader, count)`` per observer overriding ``on_backward``, for
    ``run.backward(loss, count=n)``; an override without ``count`` is called without it."""
    calls: list[Callable[..., Any]] = []
    for obs in overriding(observers, "on_backward"):
        hook = obs.on_backward
        calls.append(hook if _takes(hook, "count") else partial(_old_backward, hook))
    return tuple(calls)


def _old_backward(hook: Callable[..., Any], loss: Any, loader: Any, count: float) -> None:
    hook(loss, loader)


def _old_step_end(hook: Callable[..., Any], optimizer: Any, norm: Any, stepped: bool) -> None:
    hook(optimizer, norm)


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
