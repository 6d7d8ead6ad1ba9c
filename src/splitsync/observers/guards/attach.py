"""Start the guards and the debug recorder of one run, as observers of it (used by ``init``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from splitsync.distributed.rankstate import state_dir
from splitsync.observe import Observer
from splitsync.observers.guards.consistency import check_same_config, check_same_parameters
from splitsync.observers.guards.desync import Recorder, debug_from_environ
from splitsync.observers.guards.devices import guard_forward
from splitsync.observers.guards.hangs import Watch, default_store, split_timeout
from splitsync.observers.guards.responder import run_store
from splitsync.observers.guards.stacks import enable as enable_stacks
from splitsync.observers.guards.waits import desync_after_from
from splitsync.run.config import RunConfig

__all__ = ["DeviceGuard", "GuardObserver", "start", "collective_timeout"]

T = TypeVar("T")


class DeviceGuard(Observer):
    """The model ``run.model`` returns explains a forward that mixes devices."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.watch: Watch | None = None

    def on_wrapped(self, model: nn.Module) -> nn.Module:
        return guard_forward(model, self.device, self.watch)


class GuardObserver(DeviceGuard):
    """All runtime guards of a group run, as one observer.

    ``run.model``: initial parameters agree on all ranks, and a forward that mixes devices
    is explained. Collectives and the gradient all-reduce go through the hang watch, which
    names the ranks that never arrived; a barrier becomes its monitored barrier.
    """

    def __init__(self, device: torch.device, watch: Watch) -> None:
        super().__init__(device)
        self.watch: Watch = watch

    def on_model(self, module: nn.Module) -> None:
        check_same_parameters(module, self.device)

    def around_collective(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        if op == "barrier":
            self.watch.barrier()  # monitored: names every rank that did not arrive
            return None  # type: ignore[return-value]
        return self.watch.call(op, fn, *args)

    def on_close(self, clean: bool) -> None:
        self.watch.close()  # stop the thread that answers peers' "where are you?"


def _debug(config: RunConfig, environ: Mapping[str, str] | None) -> bool:
    return config.debug or debug_from_environ(os.environ if environ is None else environ)


def _active(config: RunConfig, world: int, environ: Mapping[str, str] | None) -> bool:
    return world > 1 and (config.guards or _debug(config, environ))


def collective_timeout(config: RunConfig, world: int,
                       environ: Mapping[str, str] | None = None) -> timedelta:
    """The process group's timeout: with guards or debug on, the user's timeout minus the
    grace needed to name the missing ranks, so the explained error comes within it."""
    if not _active(config, world, environ):
        return config.timeout
    return split_timeout(config.timeout)[0]


def start(config: RunConfig, rank: int, world: int, device: torch.device,
          argv: list[str] | None = None, environ: Mapping[str, str] | None = None
          ) -> list[Observer]:
    """Run the init-time guard and return the observers the config asks for (maybe none).

    The device guard works in one process too; the hang watch, the parameter check and the
    debug recorder need a group of two or more.
    """
    observers: list[Observer] = []
    env = os.environ if environ is None else environ
    folder = state_dir(env)
    dump_file = enable_stacks(rank, folder)  # a crash prints every thread's Python stack
    if not _active(config, world, environ):
        if config.guards:
            observers.append(DeviceGuard(device))
        return observers
    if not dist.is_gloo_available():
        raise RuntimeError("splitsync's guards and debug mode need the gloo backend for their "
                           "side channel; this PyTorch has none. Use init(guards=False).")
    if config.guards:
        check_same_config(config, list(sys.argv if argv is None else argv), device)
    side = dist.new_group(backend="gloo", timeout=split_timeout(config.timeout)[0])
    store = run_store(default_store(), side)
    watch = None
    if config.guards:
        watch = Watch(rank, world, config.timeout, side, store,
                      desync_after_from(config.desync_after, env), folder, dump_file)
        observers.append(GuardObserver(device, watch))
    if _debug(config, environ):
        recorder = Recorder(rank, world, side, config.timeout, store)
        recorder.install()
        if watch is not None:
            watch.recorder = recorder
        observers.append(recorder)
    return observers
