"""``splitsync.init()``: detect the launcher, form the group, and assemble the :class:`Run`.

The observers a run gets (guards, straggler clock, sample ledger, ``splitsync verify``'s
recorder) come from :mod:`splitsync.observers`, which reads their settings; neither this
module nor the core (``runtime`` and the Run's parts) names them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from splitsync import observers as attached
from splitsync.distributed import comm
from splitsync.distributed.device import choose_device, default_backend
from splitsync.distributed.env import detect_env
from splitsync.distributed.group import destroy_group, init_group
from splitsync.distributed.logs import attach_rank_handler
from splitsync.distributed.seeding import draw_seed, seed_everything
from splitsync.output.trackers import require_packages
from splitsync.run.config import DEFAULT_STRAGGLER_THRESHOLD, RunConfig, accumulate_for
from splitsync.run.runtime import Run
from splitsync.strategies import check_options, resolve
from splitsync.train.precision import get_precision

__all__ = ["init"]


def init(*, seed: int | None = None, strategy: str = "auto", precision: str = "32",
         device: str | torch.device | None = None, backend: str | None = None,
         accumulate: int | Callable[[int], int] = 1, timeout: float | timedelta = timedelta(minutes=10),
         debug: bool = False, guards: bool = True, run_dir: str | None = None,
         deterministic: bool = False, loggers: str | list[str] | tuple[str, ...] | None = None,
         straggler_threshold: float | None = DEFAULT_STRAGGLER_THRESHOLD,
         save_blocking: bool = True, ledger: bool = False, **strategy_options: Any) -> Run:
    """Detect the launcher, pick the device, form the process group and seed every RNG.

    ``loggers`` picks the trackers ``run.log`` writes to ("jsonl", "csv", "tensorboard",
    "wandb", "mlflow"; None: JSONL, CSV and TensorBoard under ``run_dir``). ``run.log``
    reports the slowest rank when the others wait for it more than ``straggler_threshold``
    of each step (None: no report, and no clock). ``save_blocking=False`` makes ``run.save``
    write checkpoints in the background. ``ledger=True`` records which samples every
    optimizer step trained on every rank under ``run_dir/ledger`` (``splitsync audit``).

    ``accumulate``: micro-batches per optimizer step on each process, or a function of the
    world size that returns it (``accumulate=lambda world_size: 40 // world_size`` keeps 40
    micro-batches per step in all, as nanoGPT does), called once the launcher is known.
    Any other keyword is a strategy option (DDP's ``find_unused_parameters``, ...): one
    that the strategy does not take is refused here, naming the nearest valid keyword.
    """
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    if ledger and run_dir is None:
        raise ValueError("init(ledger=True) writes the sample ledger under run_dir; pass "
                         "run_dir=... (the folder splitsync audit reads).")
    env = detect_env()  # validated before any network call
    accumulate = accumulate_for(accumulate, env.world_size)
    config = RunConfig(seed=seed, strategy=strategy, precision=precision,
                       device=None if device is None else str(device), backend=backend,
                       accumulate=accumulate, timeout=timeout, debug=debug, guards=guards,
                       run_dir=run_dir, deterministic=deterministic,
                       save_blocking=save_blocking,
                       strategy_options=strategy_options, loggers=loggers,  # type: ignore[arg-type]
                       straggler_threshold=straggler_threshold)
    config = attached.configure(config, os.environ)  # a tool may impose strategy, accumulate
    strategy = config.strategy
    if strategy_options:  # a misspelt keyword fails here, at every world size
        check_options(strategy, resolve(strategy, env.world_size), strategy_options,
                      where="splitsync.init()", parameters=_keywords())
    if config.loggers is not None:
        require_packages(config.loggers)  # a missing package fails now, not mid-run
    dev = choose_device(env, device)
    policy = get_precision(precision, dev)  # "16-mixed" on a CPU fails here, before the network
    chosen_backend = backend or default_backend(dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if env.launcher != "none":
        # with guards on, collectives wait a little less so the explained error fits in
        owns = init_group(env, chosen_backend, dev, attached.collective_timeout(config, env.world_size))
    try:
        if deterministic:
            torch.use_deterministic_algorithms(True)
        final_seed = seed if seed is not None else comm.broadcast_object(draw_seed())
        seed_everything(final_seed)
        handler = attach_rank_handler(env.rank, env.world_size)
        config, observers = attached.attach(config, env, dev, final_seed, ledger, os.environ)
    except BaseException:
        if owns:
            destroy_group()
        raise
    run = Run(config, env, dev, chosen_backend, final_seed, owns, handler, precision=policy,
              observers=observers)
    return run


def _keywords() -> tuple[str, ...]:
    """init()'s own keywords, for "did you mean" (read from its signature, so never stale)."""
    import inspect

    return tuple(n for n, p in inspect.signature(init).parameters.items()
                 if p.kind is p.KEYWORD_ONLY)
