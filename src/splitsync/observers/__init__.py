"""What ``init`` attaches to a run, as observers of the core: the guards, the straggler clock,
the sample ledger's recorder and ``splitsync verify``'s recorder.

:func:`configure` and :func:`attach` are the only names ``init`` knows: each observer reads
its own settings (the run's config, or the environment a tool launched the script with), so
a new observer is wired here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from splitsync.distributed.env import DistEnv
    from splitsync.observe import Observer
    from splitsync.run.config import RunConfig

__all__ = ["configure", "imposed_mesh", "attach", "collective_timeout"]


def configure(config: RunConfig, environ: Mapping[str, str]) -> RunConfig:
    """``config`` as the tools that launched this script impose it (``splitsync verify
    --strategies/--accumulate`` sets the strategy and the accumulation)."""
    from splitsync.tools.verify.record import settings

    strategy, accumulate = settings(environ, config.strategy, config.accumulate)
    if (strategy, accumulate) == (config.strategy, config.accumulate):
        return config
    return config.changed(strategy=strategy, accumulate=accumulate)  # checks only these two


def imposed_mesh(mesh: Mapping[str, int] | None, world_size: int,
                 environ: Mapping[str, str]) -> Mapping[str, int] | None:
    """``init(mesh=...)`` as the tools that launched this script impose it (``splitsync
    verify``'s one-process reference runs a mesh script whole)."""
    from splitsync.tools.verify.record import mesh_setting

    return mesh_setting(environ, mesh, world_size)


def collective_timeout(config: RunConfig, world_size: int) -> timedelta:
    """The timeout the process group's collectives get: with guards on, a little less than
    ``config.timeout``, so the guards' explained error comes first."""
    from splitsync.observers.guards.attach import collective_timeout as guarded

    return guarded(config, world_size)


def attach(config: RunConfig, env: DistEnv, device: torch.device, seed: int,
           environ: Mapping[str, str]) -> tuple[RunConfig, list[Observer]]:
    """The observers ``config`` and ``environ`` ask for, in the order they are called, and
    the config with ``run_dir`` where they want it (verify gives each run its own folder).
    Collective when guards or debug mode are on (they form a side group)."""
    from splitsync.observe import redirect
    from splitsync.observers.guards.attach import start as start_guards
    from splitsync.tools.verify.record import from_environ

    observers: list[Observer] = list(start_guards(config, env.rank, env.world_size, device))
    verify = from_environ(environ, env.rank, env.world_size, config.accumulate,
                          config.mesh.tp if config.mesh is not None else 1,
                          mesh=config.mesh is not None)
    if verify is not None:
        observers.append(verify)
    if config.straggler_threshold is not None and env.world_size > 1:
        from splitsync.observers.stragglers import StepClock

        # innermost around the collectives: it times the call itself, not the guards
        observers.append(StepClock(env.rank, env.world_size, config.straggler_threshold))
    if config.run_dir is not None:  # an observer may move it (verify's own folder)
        config = config.changed(run_dir=str(redirect(observers, Path(config.run_dir))))
    if config.run_dir is not None and env.rank == 0:  # where the run's time went
        from splitsync.tools.goodput.clock import GoodputClock

        ft = config.fault_tolerance
        observers.append(GoodputClock(config.run_dir, world_size=env.world_size,
                                      restart_count=env.restart_count,
                                      group=None if ft is None else ft.group,
                                      fault_tolerant=ft is not None))
    if config.ledger and config.fault_tolerance is not None:
        from splitsync.tools.audit.ledger.ft import FTLedger

        ft = config.fault_tolerance
        observers.append(FTLedger(config.run_dir, env.rank, env.world_size,
                                  env.restart_count, seed, ft.group, ft.groups))
    elif config.ledger:
        from splitsync.tools.audit.ledger.recorder import Ledger, join_launch

        shape = config.mesh  # under a mesh, a ledger per data-parallel replica
        if shape is None:
            observers.append(Ledger(config.run_dir, env.rank, env.world_size,
                                    env.restart_count, seed))
        elif shape.tp_rank(env.rank) == 0:  # its TP group's first rank records for it
            observers.append(Ledger(config.run_dir, shape.dp_rank(env.rank), shape.dp_size,
                                    env.restart_count, seed))
        else:  # the same samples as the group's first rank: nothing of its own to record
            join_launch()
    return config, observers
