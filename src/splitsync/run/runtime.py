"""The :class:`Run` handle the user's script talks to (made by ``splitsync.init``).

A Run is who this process is plus parts it delegates to: models (``run_models``), loaders
(``run_data``), the training step (``run_training``), collectives (``run_collectives``),
checkpoints (``run_checkpoints``) and ``run.log`` (``run_logging``). Tools watch it through
observers (``splitsync.observe``); the Run knows none of them by name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from splitsync.data.build import make_loader
from splitsync.data.loader import DeviceLoader
from splitsync.data.stream.loader import StreamLoader
from splitsync.distributed.device import move_to
from splitsync.distributed.env import DistEnv
from splitsync.distributed.group import destroy_group
from splitsync.distributed.logs import get_logger
from splitsync.distributed.seeding import Generators
from splitsync.observe import Observer, appended, overriding
from splitsync.output.progress import progress as _progress
from splitsync.run.checkpoints import Checkpoints
from splitsync.run.collectives import Collectives
from splitsync.run.config import RunConfig
from splitsync.run.data import Loaders
from splitsync.run.ema import Emas
from splitsync.run.logging import Logging, run_settings
from splitsync.run.models import Models
from splitsync.run.step import StepPlan, Training
from splitsync.strategies import Strategy, unwrap
from splitsync.train.precision import Precision

if TYPE_CHECKING:
    import os

    from splitsync.ckpt import ResumeState, SaveHandle

__all__ = ["Run"]


class Run:
    """Who this process is, plus the helpers that make a loop data-parallel."""

    def __init__(self, config: RunConfig, env: DistEnv, device: torch.device, backend: str,
                 seed: int, owns_group: bool, handler: logging.Handler | None, *,
                 precision: Precision, observers: Sequence[Observer] = ()) -> None:
        self.config = config
        self.env = env
        self.device = device
        self.backend = backend
        self.seed = seed
        self.rank = env.rank
        self.local_rank = env.local_rank
        self.world_size = env.world_size
        self.is_main = env.rank == 0
        self.log_handler = handler
        self._owns_group = owns_group
        self._closed = False
        # backward/step functions for this precision and accumulation, chosen once
        self._plan = StepPlan(precision, config.accumulate)
        self._data = Loaders()
        self._models = Models(device, self.world_size, self.rank, self._plan, config.strategy,
                              config.strategy_options, env.local_world_size)
        self._collectives = Collectives(device, self._data)
        self._training = Training(self._plan, self._data, self.world_size,
                                  self._models.retired.check, self._collectives.sum)
        self._generators = Generators(seed, self.rank)
        # a background save's watch listens to run.step only: the other parts keep theirs
        self._step_watch: tuple[Observer, ...] = ()
        self._checkpoints = Checkpoints(self.rank, self.world_size, self._data, config,
                                        self._watch_steps, self._unwatch_steps,
                                        self._generators)
        self._logging = Logging(config, device, self.is_main,
                                run_settings(config, self.world_size, seed, device, backend))
        self._observers: tuple[Observer, ...] = ()
        self._emas = Emas(self._plan, self._models, self.add_observer)
        for obs in observers:
            self.add_observer(obs)

    # --- observers ---------------------------------------------------------------------
    @property
    def observers(self) -> tuple[Observer, ...]:
        """The observers attached to this run, in the order they are called."""
        return self._observers

    def add_observer(self, observer: Observer) -> Observer:
        """Attach ``observer`` (a :class:`splitsync.observe.Observer`); returns it."""
        self._set_observers(appended(self._observers, observer))
        return observer

    def remove_observer(self, observer: Observer) -> None:
        """Detach ``observer`` (no-op if it is not attached)."""
        self._set_observers(tuple(o for o in self._observers if o is not observer))

    def _set_observers(self, observers: tuple[Observer, ...]) -> None:
        # Each part chooses its functions here, once, not per call.
        self._observers = observers
        for part in (self._models, self._data, self._collectives, self._checkpoints,
                     self._logging):
            part.set_observers(observers)
        self._training.set_observers((*observers, *self._step_watch))

    def _watch_steps(self, observer: Observer) -> None:
        """Have ``run.step`` call ``observer`` too, until :meth:`_unwatch_steps` (a watch of
        the core's own, not listed in ``observers``)."""
        self._step_watch = (observer,)
        self._training.set_observers((*self._observers, observer))

    def _unwatch_steps(self, observer: Observer) -> None:
        self._step_watch = tuple(o for o in self._step_watch if o is not observer)
        self._training.set_observers((*self._observers, *self._step_watch))

    # --- model -------------------------------------------------------------------------
    def model(self, module: nn.Module, *, strategy: str | None = None,
              sync_batchnorm: bool = False, compile: bool | dict[str, Any] = False,
              autocast: bool = True, activation_checkpointing: Any = None,
              **options: Any) -> nn.Module:
        """Move ``module`` to the device and wrap it for the strategy, under the run's
        precision (``autocast=False``: yours) and accumulation; ``compile=True`` (or options)
        compiles it after wrapping. ``activation_checkpointing``: True (the repeated blocks),
        a module class or tuple of classes, or a predicate ``fn(module) -> bool``; those
        submodules recompute their activations in backward. ``options`` go to the strategy
        (``fsdp``/``hsdp``: ``blocks``, ``reshard_after_forward``, ``offload``; ``hsdp``:
        ``replicate`` or ``shard``; DDP's are ignored when "auto" runs one process). Build
        the optimizer on the returned model's parameters."""
        return self._models.wrap(module, strategy, sync_batchnorm=sync_batchnorm,
                                 compile=compile, autocast=autocast, options=options,
                                 activation_checkpointing=activation_checkpointing)

    def ema(self, model: nn.Module, decay: float = 0.999) -> nn.Module:
        """A frozen copy of ``model``'s weights and floating-point buffers that becomes
        ``decay * ema + (1 - decay) * weights`` after each optimizer step that really steps
        (not an accumulation micro-step, not one the GradScaler skipped). Laid out like the
        model (FSDP: sharded the same way, updated locally). :meth:`resume` registers it,
        so checkpoints hold it; ``run.export(path, model=ema)`` writes it. Call it before
        :meth:`resume`, on the model :meth:`model` returned."""
        return self._emas.make(model, decay, resumed=self._checkpoints.checkpointer is not None)

    def strategy_of(self, model: nn.Module) -> Strategy:
        """The strategy that wrapped ``model`` (found by its type if run.model did not)."""
        return self._models.strategy_of(model)

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        """The user's own module inside any wrapper."""
        return unwrap(model)

    # --- data --------------------------------------------------------------------------
    def loader(self, data: Dataset | DataLoader, batch_size: int | None = None, *,
               shuffle: bool = False, drop_last: bool = False, num_workers: int = 0,
               collate_fn: Any = None, **extra: Any) -> DeviceLoader | StreamLoader:
        """A loader over this rank's shard; ``batch_size`` is per process. A stream (see
        docs/streams.md) gets a :class:`~splitsync.data.stream.StreamLoader`, anything
        indexable a :class:`~splitsync.data.loader.DeviceLoader`; both keep a position
        (``position()``, ``restore()``) that ``run.save``/``run.resume`` carry."""
        loader = make_loader(data, batch_size, shuffle=shuffle, drop_last=drop_last,
                             num_workers=num_workers, collate_fn=collate_fn, rank=self.rank,
                             world_size=self.world_size, seed=self.seed, device=self.device,
                             hooks=self._data.hooks, **extra)
        self._data.all.append(loader)
        self._checkpoints.attach_loader(loader)  # made after run.resume: continue from it
        return loader

    def epochs(self, n: int, start: int = 0) -> Iterator[int]:
        """Yield epoch numbers start..n-1, calling set_epoch on every loader first."""
        return self._data.epochs(n, start)

    def generator(self, per_rank: bool = True, *, name: str | None = None,
                  device: str | torch.device = "cpu") -> torch.Generator:
        """A ``torch.Generator`` for scripts that draw their own batches (nanoGPT's
        ``get_batch``: ``torch.randint(n, (b,), generator=run.generator())``).

        ``per_rank=True``: seeded from (seed, rank), a different stream on every rank;
        ``per_rank=False``: the same stream on every rank. Its state is part of the run's
        RNG state: :meth:`save` writes it and :meth:`resume` restores it (also when it is
        made after ``resume``), so a resumed run draws what the interrupted one would have.
        The same call returns the same generator; ``name`` gives a script more streams (by
        default one per-rank stream, "rank", and one shared stream, "shared")."""
        if name is None:
            name = "rank" if per_rank else "shared"
        return self._generators.get(name, per_rank, torch.device(device))

    def to_device(self, obj: Any) -> Any:
        """Move a (nested) batch to the run's device."""
        return move_to(obj, self.device)

    # --- training (the hot path: each call is one lookup and the chosen function) --------
    def backward(self, loss: torch.Tensor, count: Any = None) -> None:
        """``loss.backward()``, scaled under "16-mixed" and divided by ``accumulate``.

        ``count=n``: ``loss`` is the mean over ``n`` items (tokens, samples; an int or a
        tensor); the optimizer step then uses the mean over every item of the step on
        every rank, as one process on the global batch would (docs/token-losses.md).
        Give it on every backward of a step or on none; ``n == 0`` contributes nothing."""
        if count is None:
            self._training.backward(loss)
        else:
            self._training.backward_count(loss, count)

    def step(self, optimizer: torch.optim.Optimizer,
             clip: float | None = None) -> torch.Tensor | None:
        """``run.step(optimizer, clip=None)``: step the optimizer (every ``accumulate``-th
        call), then zero its gradients.

        Parameters, in this order: ``optimizer``, the optimizer to step (first, and the only
        one required); ``clip``, a maximum global gradient norm (best given by keyword:
        ``run.step(opt, clip=1.0)``). With ``clip`` the step does, in order: unscale the
        gradients (under "16-mixed"), clip them to ``clip`` over all ranks and shards, step,
        zero the gradients; it returns the norm before clipping (None without ``clip``, and
        on accumulation micro-steps). The first call per optimizer raises
        :class:`splitsync.StaleOptimizerError` if it holds parameters ``run.model`` replaced
        (e.g. built before an FSDP ``run.model``).
        """
        training = self._training  # a known optimizer: one dict lookup, then its step
        return training.steps.get(optimizer, training.first_step)(optimizer, clip)

    def autocast(self) -> AbstractContextManager[Any]:
        """The precision's autocast context (models from ``run.model`` already use it)."""
        return self._training.autocast()

    def accumulate(self, model: nn.Module) -> AbstractContextManager[None]:
        """Around one micro-step (forward and backward): no gradient sync unless it is the
        ``accumulate``-th. Models from ``run.model`` decide this by themselves."""
        return self._training.accumulate(model)

    @property
    def sync_gradients(self) -> bool:
        """Whether the last backward completed an accumulation window (the step will step)."""
        return self._training.sync_gradients

    @property
    def scaler(self) -> Any:
        """The GradScaler under "16-mixed" (for checkpoints), else None."""
        return self._training.scaler

    def join(self, *models: nn.Module, enable: bool = True,
             throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
        """Uneven inputs: ranks that run out of batches keep shadowing the others' all-reduces
        (``torch.distributed.algorithms.Join``) so that nobody hangs."""
        return self._training.join(*models, enable=enable,
                                   throw_on_early_termination=throw_on_early_termination)

    # --- collectives -------------------------------------------------------------------
    def mean(self, x: Any) -> Any:
        """Average over ranks (tensor or number)."""
        return self._collectives.mean(x)

    def sum(self, x: Any) -> Any:
        """Sum over ranks."""
        return self._collectives.sum(x)

    def max(self, x: Any) -> Any:
        """Maximum over ranks."""
        return self._collectives.max(x)

    def gather(self, x: Any) -> torch.Tensor:
        """Concatenate along dim 0 from all ranks, in rank order."""
        return self._collectives.gather(x)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s object on every rank."""
        return self._collectives.broadcast(obj, src)

    def barrier(self) -> None:
        """Wait for every rank (with guards: a monitored barrier that names absent ranks)."""
        self._collectives.barrier()

    def gather_for_metrics(self, x: torch.Tensor) -> torch.Tensor:
        """Gather results of the current batch without the sampler's padded duplicates."""
        return self._collectives.gather_for_metrics(x)

    # --- checkpoints -------------------------------------------------------------------
    def resume(self, dir: str | os.PathLike[str], *, keep: int = 3,
               save_blocking: bool | None = None, **objects: Any) -> ResumeState:
        """Register ``objects`` (model=, optimizer=, ...) and every :meth:`ema` (as "ema",
        "ema_1", ...) for :meth:`save` and load the
        newest complete checkpoint under ``dir`` (a path or an fsspec URL), RNG states and
        loader positions included. ``save_blocking``: :meth:`save`'s default. Collective."""
        state = self._checkpoints.resume(dir, keep=keep, save_blocking=save_blocking,
                                         **self._emas.with_emas(objects))
        if state.resumed and self.is_main:  # one line, so a log shows where a run went on
            get_logger().info("resumed from %s at epoch %d, step %d (saved by %d process%s)",
                              state.path, state.epoch, state.step, state.world_size or 0,
                              "" if state.world_size == 1 else "es")
        return state

    def save(self, dir: str | os.PathLike[str] | None = None, *, step: int | None = None,
             epoch: int | None = None, blocking: bool | None = None,
             **extra: Any) -> Path | str | SaveHandle:
        """Atomically save what :meth:`resume` registered, plus ``extra``, as
        ``dir/step-<step>/``, keeping the last ``keep``. ``blocking=False`` returns a
        :class:`~splitsync.ckpt.SaveHandle` once the state is staged in host memory (the next
        save, ``run.step`` or ``close`` raise a background failure). Collective."""
        return self._checkpoints.save(dir, step=step, epoch=epoch, blocking=blocking, **extra)

    def export(self, path: str | os.PathLike[str],
               model: nn.Module | None = None) -> Path | str:
        """Write the model's final weights to ``path`` (a path or an fsspec URL) as one
        unsharded safetensors file (``model=ema``: an EMA's)."""
        if model is None:  # the EMAs run.resume registered are not "the model"
            model = self._emas.trained_model(self._checkpoints.checkpointer)
        return self._checkpoints.export(path, model)

    # --- output ------------------------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only."""
        if self.is_main:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    def progress(self, iterable: Iterable[Any], *, total: int | None = None, desc: str = "",
                 every: int | None = None) -> Iterable[Any]:
        """``iterable`` with a progress bar on rank 0 (plain lines when not a terminal)."""
        return _progress(iterable, show=self.is_main, total=total, desc=desc, every=every)

    def log(self, count: Any = None, **metrics: Any) -> dict[str, int | float]:
        """Average ``metrics`` over ranks (one all-reduce); rank 0 prints them and hands them
        to the trackers chosen with ``init(loggers=...)``. ``count=n``: each rank's numbers
        weigh by its ``n`` items (the mean over all items), and the record's ``count`` is
        their total."""
        return self._logging.log(metrics, count)

    def log_config(self, params: dict[str, Any]) -> None:
        """Record ``params`` (nested dicts allowed) once as hyperparameters with every
        tracker, next to splitsync's own settings (rank 0 records)."""
        self._logging.log_config(params)

    def profile(self, *, wait: int = 1, warmup: int = 1, active: int = 3,
                ranks: Sequence[int] | None = (0,), **options: Any) -> AbstractContextManager[Any]:
        """``torch.profiler`` on ``ranks`` (None: all), stepped by :meth:`step`; traces under
        ``<run_dir>/profile`` and a top-ops table (options: see splitsync.run.profile)."""
        from splitsync.run.profile import profile_steps

        return profile_steps(self, wait=wait, warmup=warmup, active=active, ranks=ranks,
                             **options)

    @property
    def logger(self) -> logging.Logger:
        """The ``splitsync`` logger (rank-prefixed)."""
        return get_logger()

    # --- teardown ----------------------------------------------------------------------
    def close(self, *, clean: bool = True) -> None:
        """Destroy the process group this run created; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            try:  # a background save commits (or raises its failure) before teardown
                self._checkpoints.settle(wait=True, raise_errors=clean)
            finally:
                for obs in reversed(overriding(self._observers, "on_close")):
                    obs.on_close(clean)  # e.g. debug mode: last cross-check, then unpatch
            if clean and self._owns_group and self.world_size > 1:
                # Every rank ends its communication before any tears its group down (a rank
                # that exits early can abort a peer inside gloo); best effort, reported.
                try:
                    self.barrier()
                except Exception as exc:  # the collective's error says which rank and why
                    get_logger().warning("not every rank reached close(): %s", exc)
        finally:
            self._logging.close()
            self._checkpoints.close(clean=False)  # also destroys the background group
            if self.log_handler is not None:
                get_logger().removeHandler(self.log_handler)
            if self._owns_group:
                destroy_group()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(clean=exc_type is None)

    def __repr__(self) -> str:
        return (f"Run(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"backend={self.backend!r})")
