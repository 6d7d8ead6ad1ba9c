"""The :class:`Run` handle the user's script talks to (made by ``splitsync.init``).

A Run is who this process is plus parts it delegates to: models (``run/models.py``), loaders
(``run/data.py``), the training step (``run/training.py`` over ``run/step.py``), collectives
(``run/collectives.py``), checkpoints (``ckpt.checkpointer.Checkpointer``) and ``run.log`` (``run/logging.py``). Its verbs
come in families, each a mixin beside its part: training (``run/training.py``), collectives
(``run/collectives.py``) and checkpoints (``run/checkpoints.py``); this module keeps the
rest (models, data, output, observers, teardown). Tools watch it through observers
(``splitsync.observe``); the Run knows none of them by name.
"""

from __future__ import annotations

import atexit
import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from functools import partial
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from splitsync.ckpt.checkpointer import Checkpointer
from splitsync.data.build import check_marks, make_loader, warn_if_empty
from splitsync.data.loader import DeviceLoader
from splitsync.data.stream.loader import StreamLoader
from splitsync.distributed.device import move_to
from splitsync.distributed.env import DistEnv
from splitsync.distributed.group import destroy_group
from splitsync.distributed.logs import get_logger
from splitsync.distributed.mesh import MeshShape, replica_sum
from splitsync.distributed.seeding import Generators
from splitsync.errors import Preempted
from splitsync.observe import Observer, appended, overriding
from splitsync.output.progress import progress as _progress
from splitsync.run.checkpoints import CheckpointVerbs
from splitsync.run.collectives import Collectives, CollectiveVerbs
from splitsync.run.config import RunConfig
from splitsync.run.data import Loaders
from splitsync.run.ema import Decay, Emas
from splitsync.run.logging import Logging, run_settings
from splitsync.run.meter import EpochMeter
from splitsync.run.models import Models
from splitsync.run.preempt import Preemption, preemption_for
from splitsync.run.step import StepPlan
from splitsync.run.tolerance import PLAIN, Tolerance
from splitsync.run.training import Training, TrainingVerbs
from splitsync.strategies import Strategy, unwrap
from splitsync.train.precision import Precision

__all__ = ["Run"]


class Run(TrainingVerbs, CollectiveVerbs, CheckpointVerbs):
    """Who this process is, plus the helpers that make a loop data-parallel."""

    def __init__(self, config: RunConfig, env: DistEnv, device: torch.device, backend: str,
                 seed: int, owns_group: bool, handler: logging.Handler | None, *,
                 precision: Precision, observers: Sequence[Observer] = (),
                 strategy: str, device_mesh: Any = None) -> None:
        self.config = config
        self.env = env
        self.device = device
        self.backend = backend
        self.seed = seed
        self.rank = env.rank
        self.local_rank = env.local_rank
        self.world_size = env.world_size
        self.is_main = env.rank == 0
        self.mesh = device_mesh  # init(mesh=...)'s DeviceMesh (None: none, or one process)
        shape = config.mesh if config.mesh is not None else MeshShape(1, env.world_size, 1)
        self.dp_rank = shape.dp_rank(env.rank)  # the data-parallel replica this rank is in
        self.dp_size = shape.dp_size  # replicas that read different batches
        self.tp_rank = shape.tp_rank(env.rank)  # this rank's place in its TP group
        self.tp_size = shape.tp
        self.log_handler = handler
        self._owns_group = owns_group
        self._closed = False
        # backward/step functions for this precision and accumulation, chosen once
        self._plan = StepPlan(precision, config.accumulate)
        self._data = Loaders()
        # strategy: config.strategy as init resolved it for this world size ("auto" -> ...)
        self._models = Models(device, self.world_size, self.rank, self._plan, config.strategy,
                              config.strategy_options, env.local_world_size, resolved=strategy,
                              mesh=device_mesh, mesh_shape=config.mesh)
        self._collectives = Collectives(device, self._data)
        # count= sums items over the data-parallel replicas (a TP group counts its batch once)
        self._training = Training(self._plan, self._data, self.dp_size, self._new_optimizer,
                                  partial(replica_sum, self._collectives.reduce, self.tp_size))
        self._plan.ends = self._data.run_ends  # the run's last batch closes its last window
        self._data.on_end = self._training.epochs_ended
        self._generators = Generators(seed, self.rank)
        # a background save's watch listens to run.step only: the other parts keep theirs
        self._step_watch: tuple[Observer, ...] = ()
        self._checkpoints = Checkpointer(self.rank, self.world_size, self._data.all,
                                         generators=self._generators, timeout=config.timeout,
                                         save_blocking=config.save_blocking,
                                         watch=self._watch_steps, unwatch=self._unwatch_steps,
                                         wrapped=self._wrapped, window=self._training,
                                         loader_hooks=self._data.hooks)
        self._logging = Logging(config, device, self.is_main,
                                run_settings(config, self.world_size, seed, device, backend))
        self._observers: tuple[Observer, ...] = ()
        self._emas = Emas(self._plan, self._models, self.add_observer,
                          steps=lambda: self._checkpoints.step)
        self._meters: list[EpochMeter] = []  # run.meter's, saved with the checkpoints
        self._preemption: Preemption | None = None  # made by the first run.resume
        self._preempt_tried = False
        # what differs under fault tolerance, as a part (config.fault_tolerance: FTOptions)
        ft = config.fault_tolerance
        self._tolerance: Tolerance = PLAIN if ft is None else self._fault_tolerance(ft)
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

    def _fault_tolerance(self, ft: Any) -> Tolerance:
        from splitsync.ft.part import FaultTolerance  # torchft's side, only when asked for

        return FaultTolerance(ft, env=self.env, device=self.device, backend=self.backend,
                              seed=self.seed, data=self._data, checkpoints=self._checkpoints,
                              observers=lambda: self._observers)

    # --- fault tolerance ---------------------------------------------------------------
    @property
    def replica_group(self) -> int:
        """This process's replica group under ``fault_tolerance="torchft"`` (else 0)."""
        return self._tolerance.group

    @property
    def replica_groups(self) -> int:
        """Replica groups in the job (1 without fault tolerance)."""
        return self._tolerance.groups

    @property
    def session(self) -> Any:
        """The group's torchft session (its Manager, cursor and the step under way) under
        ``fault_tolerance="torchft"``; None without fault tolerance."""
        return self._tolerance.session

    def _arm_preemption(self) -> Preemption | None:
        """At the first ``run.resume`` (before it loads: a signal from then on stops the run
        too), the preemption handling ``init(preempt_signals=...)`` asked for (none under
        fault tolerance: a group told to stop is a group lost, which the others train
        through; its signals keep their usual effect, and its agent restarts it)."""
        if not self._tolerance.preemptible:
            return None
        if not self._preempt_tried:
            self._preempt_tried = True
            self._preemption = preemption_for(self.config, self.rank, self.world_size,
                                              self._checkpoints, self._generators,
                                              self._watch_steps, self._unwatch_steps)
        return self._preemption

    def _watch_steps(self, observer: Observer) -> None:
        """Have ``run.step`` call ``observer`` too, until :meth:`_unwatch_steps` (a watch of
        the core's own, not listed in ``observers``: a background save's, a preemption's)."""
        if observer not in self._step_watch:
            self._step_watch = (*self._step_watch, observer)
        self._training.set_observers((*self._observers, *self._step_watch))

    def _unwatch_steps(self, observer: Observer) -> None:
        self._step_watch = tuple(o for o in self._step_watch if o is not observer)
        self._training.set_observers((*self._observers, *self._step_watch))

    def _new_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The first ``run.step`` of ``optimizer``: refuse it if stale, count its steps."""
        self._models.retired.check(optimizer)
        self._checkpoints.count(optimizer)

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
        def wrap(name: str | None, opts: dict[str, Any]) -> nn.Module:
            return self._models.wrap(module, name, sync_batchnorm=sync_batchnorm,
                                     compile=compile, autocast=autocast, options=opts,
                                     activation_checkpointing=activation_checkpointing)

        if self._tolerance is PLAIN:
            return wrap(strategy, options)
        return self._tolerance.model(strategy or self.config.strategy, options, wrap)

    def ema(self, model: nn.Module, decay: Decay = 0.999, *, every: int = 1,
            warmup: int = 0) -> nn.Module:
        """A frozen copy of ``model``'s weights and floating-point buffers that becomes
        ``decay * ema + (1 - decay) * weights`` after each optimizer step that really steps
        (not an accumulation micro-step, not one the GradScaler skipped). ``every=k``: after
        every k-th optimizer step only; ``warmup=n``: a copy of the weights for the first n;
        ``decay``: a number or a function of the optimizer step (1, 2, ...). Laid out like the
        model (FSDP: sharded the same way, updated locally). Checkpoints hold it, each rank's
        buffers as that rank's (made after :meth:`resume`, it is loaded from the checkpoint
        resume read, if that holds it); ``run.export(path, model=ema)`` writes it. Takes the
        model :meth:`model` returned."""
        ema = self._emas.make(model, decay, every=every, warmup=warmup)
        self._ema_made(ema)
        return ema

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
               collate_fn: Any = None, train: bool | None = None, repeats: int = 1,
               **extra: Any) -> DeviceLoader | StreamLoader:
        """A loader over this rank's shard; ``batch_size`` is per process. A stream (see
        docs/streams.md) gets a :class:`~splitsync.data.stream.StreamLoader`, anything
        indexable a :class:`~splitsync.data.loader.DeviceLoader`; both keep a position
        (``position()``, ``restore()``) that ``run.save``/``run.resume`` carry.
        ``train=False`` marks an evaluation loader (the ledger and ``splitsync audit``
        count it apart; under fault tolerance each group reads it alone); ``repeats=k``
        declares a sampler that delivers each sample k times per epoch by design (repeated
        augmentation), which the audit checks against k."""
        check_marks(train, repeats)

        def plain() -> DeviceLoader | StreamLoader:
            loader = make_loader(data, batch_size, shuffle=shuffle, drop_last=drop_last,
                                 num_workers=num_workers, collate_fn=collate_fn,
                                 rank=self.dp_rank, world_size=self.dp_size,  # a TP group alike
                                 seed=self.seed, device=self.device, hooks=self._data.hooks,
                                 shield=self.config.preempt_signals, **extra)
            loader.train, loader.repeats = train, repeats
            warn_if_empty(loader, self.rank, self.world_size)
            self._data.all.append(loader)
            self._checkpoints.attach_loader(loader)  # made after run.resume: continue from it
            return loader

        if train is False:  # evaluation: never the fault-tolerant cursor's loader
            return plain()
        loader = self._tolerance.loader(data, batch_size, {
            "shuffle": shuffle, "drop_last": drop_last, "num_workers": num_workers,
            "collate_fn": collate_fn, **extra}, plain)
        loader.train, loader.repeats = train, repeats
        return loader

    def epochs(self, n: int, start: int = 0) -> Iterator[int]:
        """Yield epoch numbers start..n-1, calling set_epoch on every loader first (under
        fault tolerance: as the job's data cursor reaches them)."""
        return self._tolerance.epochs(n, start, self._data.epochs)

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

    # --- output ------------------------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on rank 0 only."""
        if self.is_main:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    def progress(self, iterable: Iterable[Any], *, total: int | None = None, desc: str = "",
                 every: int | None = None) -> Iterable[Any]:
        """``iterable`` with a progress bar on rank 0 (plain lines when not a terminal); under
        fault tolerance, over the training loader, the batches committed steps took."""
        return self._tolerance.progress(iterable, desc, every, lambda: _progress(
            iterable, show=self.is_main, total=total, desc=desc, every=every))

    def log(self, count: Any = None, **metrics: Any) -> dict[str, int | float]:
        """Average ``metrics`` over ranks (one all-reduce) and return the averages on every
        rank; rank 0 prints them and hands them to the trackers chosen with
        ``init(loggers=...)``. A collective: every rank calls it, with the same names (not
        Fabric's ``log_dict``, which logs rank 0's own values). ``count=n``: each rank's
        numbers weigh by its ``n`` items (the mean over all items), and the record's
        ``count`` is their total. Under fault tolerance a record is written for committed
        steps only, numbered by them."""
        if self._tolerance is PLAIN:
            return self._logging.log(metrics, count)
        return self._tolerance.log(metrics, count, self._logging.log)

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
        atexit.unregister(self._close_at_exit)
        preemption = self._preemption
        if preemption is not None:
            preemption.close(clean)  # no stop from here on; the signal handlers go back
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
            if preemption is not None:
                preemption.after_close()  # e.g. requeue a stopped SLURM job
            self._tolerance.close()

    def _close_at_exit(self) -> None:
        """``close()`` at interpreter exit for a run never closed (``init`` registers it):
        not clean after an uncaught exception (no barrier with peers it may have left in a
        collective); never raises, so the script's outcome decides the exit code."""
        try:
            self.close(clean=getattr(sys, "last_value", None) is None)
        except BaseException as exc:  # a save that failed, a peer gone: said, not raised
            get_logger().warning("closing the run at exit: %s: %s", type(exc).__name__, exc)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # a preemption's stop is a clean end: every rank stops at the same step
        self.close(clean=exc_type is None or isinstance(exc, Preempted))

    def __repr__(self) -> str:
        return (f"Run(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"backend={self.backend!r})")
