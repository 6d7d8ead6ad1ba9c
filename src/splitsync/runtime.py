"""``init()`` and the :class:`Run` handle the user's script talks to."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from splitsync import comm
from splitsync.config import RunConfig
from splitsync.data import DeviceLoader, build_loader, loader_kwargs_from
from splitsync.device import choose_device, default_backend, move_to
from splitsync.env import DistEnv, detect_env
from splitsync.group import destroy_group, init_group
from splitsync.guards import check_same_parameters, guard_forward
from splitsync.guards.session import GuardSession, collective_timeout
from splitsync.guards.session import start as start_guards
from splitsync.logs import attach_rank_handler, get_logger
from splitsync.seeding import draw_seed, seed_everything
from splitsync.strategies import WrapContext, get_strategy, resolve, unwrap
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
        self._closed = False
        self._guards = guards
        self._watch = guards.watch if guards is not None else None
        self._verify = verify  # set only under `splitsync verify script.py`

    # --- model -------------------------------------------------------------------------
    def model(self, module: nn.Module, *, strategy: str | None = None,
              sync_batchnorm: bool = False, **options: Any) -> nn.Module:
        """Move ``module`` to the device and wrap it for the chosen strategy."""
        name = resolve(strategy or self.config.strategy, self.world_size)
        strat = get_strategy(name)
        unknown = set(options) - set(strat.options)
        if unknown:
            raise TypeError(
                f"strategy {name!r} does not take {sorted(unknown)}; it takes "
                f"{list(strat.options) or 'no options'}."
            )
        if sync_batchnorm and self.world_size > 1:
            module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        if name != "dp":  # DataParallel places replicas itself, from device 0
            module = module.to(self.device)
        if self._watch is not None:
            check_same_parameters(module, self.device)
        if self._verify is not None:
            self._verify.on_model(module)
        ctx = WrapContext(self.device, self.world_size, self.rank, self.config.precision)
        options = {**self.config.strategy_options, **options}
        wrapped = strat.wrap(module, ctx, options)
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
        """``loss.backward()``."""
        if self._verify is not None:
            self._verify.on_backward(loss, self._active)
        if self._watch is not None and self.world_size > 1:
            self._watch.call("backward (gradient all-reduce)", loss.backward)
        else:
            loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step the optimizer, then zero its gradients (set to None)."""
        if self._verify is not None:
            self._verify.on_step_begin()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self._verify is not None:
            self._verify.on_step_end()  # may end the script once enough steps are recorded

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


