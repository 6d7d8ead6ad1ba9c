"""``init()`` and the :class:`Run` handle the user's script talks to."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from splitsync import comm
from splitsync.accumulate import StepPlan, prepare_module
from splitsync.compiling import compile_model
from splitsync.config import RunConfig
from splitsync.data import DeviceLoader, build_loader, loader_kwargs_from
from splitsync.device import choose_device, default_backend, move_to
from splitsync.env import DistEnv, detect_env
from splitsync.group import destroy_group, init_group
from splitsync.guards import check_same_parameters, guard_forward
from splitsync.guards.session import GuardSession, collective_timeout
from splitsync.guards.session import start as start_guards
from splitsync.logs import attach_rank_handler, get_logger
from splitsync.metrics import MetricsLog, average_metrics
from splitsync.precision import Precision, get_precision
from splitsync.progress import progress as _progress
from splitsync.run_checkpoints import CheckpointMethods
from splitsync.run_collectives import CollectiveMethods
from splitsync.run_training import TrainingMethods
from splitsync.seeding import draw_seed, seed_everything
from splitsync.strategies import WrapContext, get_strategy, resolve, unwrap
from splitsync.syncbn import convert_sync_batchnorm
from splitsync.verify.record import ScriptRecorder
from splitsync.verify.record import from_environ as verify_recorder

if TYPE_CHECKING:
    from splitsync.ckpt import Checkpointer

__all__ = ["init", "Run"]


class Run(TrainingMethods, CollectiveMethods, CheckpointMethods):
    """Who this process is, plus the helpers that make a loop data-parallel."""

    def __init__(self, config: RunConfig, env: DistEnv, device: torch.device, backend: str,
                 seed: int, owns_group: bool, handler: logging.Handler | None,
                 guards: GuardSession | None = None, verify: ScriptRecorder | None = None,
                 precision: Precision | None = None) -> None:
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
        self._loaders: list[DeviceLoader] = []
        self._active: DeviceLoader | None = None
        self._ckpt: Checkpointer | None = None
        self._closed = False
        self._metrics: MetricsLog | None = None
        # backward/step functions for this precision and accumulation, chosen once
        if precision is None:
            precision = get_precision(config.precision, device)
        self._plan = StepPlan(precision, config.accumulate)
        self._guards = guards
        self._watch = guards.watch if guards is not None else None
        self._verify = verify  # set only under `splitsync verify script.py`

    # --- model -------------------------------------------------------------------------
    def model(self, module: nn.Module, *, strategy: str | None = None,
              sync_batchnorm: bool = False, compile: bool | dict[str, Any] = False,
              autocast: bool = True, **options: Any) -> nn.Module:
        """Move ``module`` to the device and wrap it for the chosen strategy.

        The forward then runs under the run's precision (autocast, unless ``autocast=False``)
        and accumulation; ``compile=True`` (or a dict of ``torch.compile`` options) compiles
        it after wrapping.
        """
        name = resolve(strategy or self.config.strategy, self.world_size)
        strat = get_strategy(name)
        unknown = set(options) - set(strat.options)
        if unknown:
            raise TypeError(
                f"strategy {name!r} does not take {sorted(unknown)}; it takes "
                f"{list(strat.options) or 'no options'}."
            )
        if sync_batchnorm and self.world_size > 1:
            module = convert_sync_batchnorm(module, self.device)
        if name != "dp":  # DataParallel places replicas itself, from device 0
            module = module.to(self.device)
        if self._watch is not None:
            check_same_parameters(module, self.device)
        if self._verify is not None:
            self._verify.on_model(module)
        module = prepare_module(module, self._plan.precision)
        ctx = WrapContext(self.device, self.world_size, self.rank, self.config.precision)
        options = {**self.config.strategy_options, **options}
        wrapped = strat.wrap(module, ctx, options)
        if compile:
            wrapped = compile_model(wrapped, name, compile)
        wrapped = self._plan.install_forward(wrapped, autocast)
        return guard_forward(wrapped, self.device, self._watch) if self.config.guards else wrapped

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        """The user's own module inside any wrapper."""
        return unwrap(model)

    # --- data --------------------------------------------------------------------------
    def loader(self, data: Dataset | DataLoader, batch_size: int | None = None, *,
               shuffle: bool = False, drop_last: bool = False, num_workers: int = 0,
               collate_fn: Any = None, **extra: Any) -> DeviceLoader:
        """A loader over this rank's shard; ``batch_size`` is per process."""
        if isinstance(data, DataLoader):
            kwargs = loader_kwargs_from(data)
            if kwargs.get("worker_init_fn") is None:
                kwargs.pop("worker_init_fn", None)
            kwargs.update(extra)
        else:
            if batch_size is None:
                raise TypeError("run.loader(dataset, batch_size=...) needs a per-process batch_size.")
            kwargs = dict(dataset=data, batch_size=batch_size, shuffle=shuffle,
                          drop_last=drop_last, num_workers=num_workers, collate_fn=collate_fn,
                          **extra)
        if self._verify is not None:
            kwargs = self._verify.loader_kwargs(kwargs)
        loader = build_loader(rank=self.rank, world_size=self.world_size, seed=self.seed,
                              device=self.device, on_iter=self._set_active, **kwargs)
        self._loaders.append(loader)
        if self._ckpt is not None:  # made after run.resume: continue where the checkpoint left it
            self._ckpt.attach_loader(loader, len(self._loaders) - 1)
        return loader

    def _set_active(self, loader: DeviceLoader) -> None:
        self._active = loader
        if self._verify is not None:
            self._verify.on_iter(loader)

    def epochs(self, n: int, start: int = 0) -> Iterator[int]:
        """Yield epoch numbers start..n-1, calling set_epoch on every loader first."""
        if self._verify is not None:
            n = self._verify.epochs(start, n)
        for epoch in range(start, n):
            for loader in self._loaders:
                loader.set_epoch(epoch)
            yield epoch

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
        """``iterable`` with a progress bar on rank 0 (plain lines when not a terminal)."""
        return _progress(iterable, show=self.is_main, total=total, desc=desc, every=every)

    def log(self, **metrics: Any) -> dict[str, int | float]:
        """Average ``metrics`` over ranks; rank 0 prints them and appends them to run_dir."""
        record = average_metrics(metrics, self.device)
        if self.is_main:
            if self._metrics is None:
                self._metrics = MetricsLog(self.config.run_dir)
            self._metrics.write(record)
        return record

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
            if self._verify is not None:
                self._verify.flush()
            if self._guards is not None:
                self._guards.close(clean)  # debug mode: last cross-check, then unpatch
            if clean and self._owns_group and self.world_size > 1:
                self._barrier_before_teardown()
        finally:
            if self._metrics is not None:
                self._metrics.close()
            if self._ckpt is not None:
                self._ckpt.close()
            if self.log_handler is not None:
                get_logger().removeHandler(self.log_handler)
            if self._owns_group:
                destroy_group()

    def _barrier_before_teardown(self) -> None:
        # Every rank finishes its communication before any tears its group down: a rank
        # that exits early can abort a peer still inside gloo. Best effort: a rank that
        # does not arrive is reported, and teardown goes on.
        try:
            self.barrier()
        except Exception as exc:  # the collective's own error says which rank and why
            get_logger().warning("not every rank reached close(): %s", exc)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(clean=exc_type is None)

    def __repr__(self) -> str:
        return (f"Run(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"backend={self.backend!r})")


def init(*, seed: int | None = None, strategy: str = "auto", precision: str = "32",
         device: str | torch.device | None = None, backend: str | None = None,
         accumulate: int = 1, timeout: float | timedelta = timedelta(minutes=10),
         debug: bool = False, guards: bool = True, run_dir: str | None = None,
         deterministic: bool = False, **strategy_options: Any) -> Run:
    """Detect the launcher, pick the device, form the process group and seed every RNG."""
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    config = RunConfig(seed=seed, strategy=strategy, precision=precision,
                       device=None if device is None else str(device), backend=backend,
                       accumulate=accumulate, timeout=timeout, debug=debug, guards=guards,
                       run_dir=run_dir, deterministic=deterministic,
                       strategy_options=strategy_options)
    env = detect_env()  # validated before any network call
    dev = choose_device(env, device)
    policy = get_precision(precision, dev)  # "16-mixed" on a CPU fails here, before the network
    chosen_backend = backend or default_backend(dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if env.launcher != "none":
        # with guards on, collectives wait a little less so the explained error fits in
        owns = init_group(env, chosen_backend, dev, collective_timeout(config, env.world_size))
    try:
        if deterministic:
            torch.use_deterministic_algorithms(True)
        final_seed = seed if seed is not None else comm.broadcast_object(draw_seed())
        seed_everything(final_seed)
        handler = attach_rank_handler(env.rank, env.world_size)
        guards_on = start_guards(config, env.rank, env.world_size, dev)
        verify = verify_recorder(os.environ, env.rank, env.world_size)
    except BaseException:
        if owns:
            destroy_group()
        raise
    return Run(config, env, dev, chosen_backend, final_seed, owns, handler, guards_on, verify,
               policy)


