"""``init()`` and the :class:`Run` handle the user's script talks to."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
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
from splitsync.join import join
from splitsync.logs import attach_rank_handler, get_logger
from splitsync.metrics import MetricsLog, average_metrics
from splitsync.precision import get_precision
from splitsync.progress import progress as _progress
from splitsync.seeding import draw_seed, seed_everything
from splitsync.strategies import WrapContext, get_strategy, resolve, unwrap
from splitsync.syncbn import convert_sync_batchnorm

if TYPE_CHECKING:
    from pathlib import Path

    from splitsync.ckpt import Checkpointer, ResumeState
from splitsync.verify.record import ScriptRecorder
from splitsync.verify.record import from_environ as verify_recorder

__all__ = ["init", "Run"]


class Run:
    """Who this process is, plus the helpers that make a loop data-parallel."""

    def __init__(self, config: RunConfig, env: DistEnv, device: torch.device, backend: str,
                 seed: int, owns_group: bool, handler: logging.Handler | None,
                 guards: GuardSession | None = None, verify: ScriptRecorder | None = None
                 ) -> None:
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
        self._plan = StepPlan(get_precision(config.precision, device), config.accumulate)
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

    # --- step --------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled under "16-mixed" and divided by ``accumulate``."""
        if self._verify is not None:
            self._verify.on_backward(loss, self._active)
        if self._watch is not None and self.world_size > 1:
            self._watch.call("backward (gradient all-reduce)", self._plan.backward, loss)
        else:
            self._plan.backward(loss)

    def step(self, optimizer: torch.optim.Optimizer,
             clip: float | None = None) -> torch.Tensor | None:
        """Step the optimizer, then zero its gradients (set to None).

        With ``accumulate=k`` only every k-th call steps (the others return at once).
        ``clip`` clips gradients to that global norm first (unscaled under "16-mixed") and
        the norm before clipping is returned; without ``clip`` the result is None.
        """
        if self._verify is None:
            return self._plan.step(optimizer, clip)
        self._verify.on_step_begin()
        norm = self._plan.step(optimizer, clip)
        self._verify.on_step_end()  # may end the script once enough steps are recorded
        return norm

    def autocast(self) -> AbstractContextManager[Any]:
        """The precision's autocast context (models from ``run.model`` already use it)."""
        return self._plan.precision.autocast()

    def accumulate(self, model: nn.Module) -> AbstractContextManager[None]:
        """Around one micro-step (forward and backward): no gradient sync unless it is the
        ``accumulate``-th. Models from ``run.model`` decide this by themselves."""
        return self._plan.accumulate(model)

    @property
    def sync_gradients(self) -> bool:
        """Whether the last backward completed an accumulation window (the step will step)."""
        return self._plan.micro % self._plan.every == 0

    @property
    def scaler(self) -> Any:
        """The GradScaler under "16-mixed" (for checkpoints), else None."""
        return self._plan.scaler

    def join(self, *models: nn.Module, enable: bool = True,
             throw_on_early_termination: bool = False) -> AbstractContextManager[Any]:
        """Uneven inputs: ranks that run out of batches keep shadowing the others' all-reduces
        (``torch.distributed.algorithms.Join``) so that nobody hangs."""
        return join(*models, enable=enable, throw_on_early_termination=throw_on_early_termination)

    # --- checkpoints -------------------------------------------------------------------
    def resume(self, dir: str | os.PathLike[str], *, keep: int = 3, **objects: Any) -> ResumeState:
        """Register ``objects`` (model=, optimizer=, scheduler=, scaler=, ...) for
        :meth:`save` and load the newest complete checkpoint under ``dir``, if any.

        RNG states and the position of every loader made by :meth:`loader` are restored too,
        so the loop continues exactly where the checkpoint was taken. Collective.
        """
        from pathlib import Path

        from splitsync.ckpt import Checkpointer

        if self._ckpt is not None:
            self._ckpt.close()
        self._ckpt = Checkpointer(Path(dir), objects, keep=keep, rank=self.rank,
                                  world_size=self.world_size)
        return self._ckpt.load(self._loaders)

    def save(self, dir: str | os.PathLike[str] | None = None, *, step: int | None = None,
             epoch: int | None = None, **extra: Any) -> Path:
        """Atomically save everything registered by :meth:`resume`, plus ``extra`` (JSON or
        tensors), as ``dir/step-<step>/``; older checkpoints beyond ``keep`` are removed.
        Collective: call it on every rank."""
        from pathlib import Path

        if self._ckpt is None:
            raise RuntimeError("run.save() saves the objects registered by run.resume(dir, "
                               "model=..., optimizer=...); call run.resume first.")
        root = self._ckpt.root if dir is None else Path(dir)
        return self._ckpt.save(root, self._loaders, step=step, epoch=epoch, extra=extra)

    def export(self, path: str | os.PathLike[str], model: nn.Module | None = None) -> Path:
        """Write the model's final weights to ``path`` as one unsharded safetensors file."""
        from splitsync.ckpt.export import export_safetensors

        if model is None:
            models = list(self._ckpt.models.values()) if self._ckpt is not None else []
            if len(models) != 1:
                raise TypeError("run.export(path) exports the model registered by run.resume; "
                                f"{len(models)} are registered, so pass model=...")
            model = models[0]
        return export_safetensors(model, path, self.rank)

    # --- collectives -------------------------------------------------------------------
    def _collective(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        # The hang guard only counts calls; it acts when one fails.
        return fn(*args) if self._watch is None else self._watch.call(op, fn, *args)

    def mean(self, x: Any) -> Any:
        """Average over ranks (tensor or number)."""
        return self._collective("all_reduce", comm.reduce, x, "mean", self.device)

    def sum(self, x: Any) -> Any:
        """Sum over ranks."""
        return self._collective("all_reduce", comm.reduce, x, "sum", self.device)

    def max(self, x: Any) -> Any:
        """Maximum over ranks."""
        return self._collective("all_reduce", comm.reduce, x, "max", self.device)

    def gather(self, x: Any) -> torch.Tensor:
        """Concatenate along dim 0 from all ranks, in rank order."""
        return self._collective("all_gather", comm.all_gather, x, self.device)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s object on every rank."""
        return self._collective("broadcast", comm.broadcast_object, obj, src)

    def barrier(self) -> None:
        """Wait for every rank (with guards: a monitored barrier that names absent ranks)."""
        if self._watch is not None:
            self._watch.barrier()
        else:
            comm.barrier()

    def gather_for_metrics(self, x: torch.Tensor) -> torch.Tensor:
        """Gather results of the current batch without the sampler's padded duplicates."""
        if self._active is not None:
            x = self._active.trim_padding(x)
        return self._collective("all_gather", comm.all_gather, x, self.device)

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
        finally:
            if self._metrics is not None:
                self._metrics.close()
            if self._ckpt is not None:
                self._ckpt.close()
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
    get_precision(precision, dev)  # "16-mixed" on a CPU fails here, before any network call
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
    return Run(config, env, dev, chosen_backend, final_seed, owns, handler, guards_on, verify)


