"""Start and stop the guards and debug recorder of one run (called by ``init``/``close``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from splitsync.config import RunConfig
from splitsync.guards.consistency import check_same_config
from splitsync.guards.hangs import Watch, default_store, split_timeout
from splitsync.guards.site import user_site

__all__ = ["GuardSession", "start", "collective_timeout"]


@dataclass(frozen=True)
class GuardSession:
    """What one run switched on: the hang guard and/or the debug-mode recorder."""

    watch: Watch | None
    recorder: Any | None  # splitsync.desync.Recorder

    def close(self, clean: bool) -> None:
        """Final desync check on a clean exit, then restore torch.distributed."""
        if self.recorder is None:
            return
        try:
            if clean:
                self.recorder.finish(user_site())
        finally:
            self.recorder.uninstall()


def _active(config: RunConfig, world: int, environ: Mapping[str, str] | None) -> bool:
    from splitsync.desync import debug_from_environ

    debug = config.debug or debug_from_environ(os.environ if environ is None else environ)
    return world > 1 and (config.guards or debug)


def collective_timeout(config: RunConfig, world: int,
                       environ: Mapping[str, str] | None = None) -> timedelta:
    """The process group's timeout: with guards or debug on, the user's timeout minus the
    grace needed to name the missing ranks, so the explained error comes within it."""
    if not _active(config, world, environ):
        return config.timeout
    return split_timeout(config.timeout)[0]


def start(config: RunConfig, rank: int, world: int, device: torch.device,
          argv: list[str] | None = None, environ: Mapping[str, str] | None = None
          ) -> GuardSession | None:
    """Run the init-time guard and install what the config asks for; None when nothing is on."""
    from splitsync.desync import Recorder, debug_from_environ

    if not _active(config, world, environ):
        return None
    debug = config.debug or debug_from_environ(os.environ if environ is None else environ)
    if not dist.is_gloo_available():
        raise RuntimeError("splitsync's guards and debug mode need the gloo backend for their "
                           "side channel; this PyTorch has none. Use init(guards=False).")
    if config.guards:
        check_same_config(config, list(sys.argv if argv is None else argv), device)
    side = dist.new_group(backend="gloo", timeout=split_timeout(config.timeout)[0])
    store = default_store()
    watch = Watch(rank, world, config.timeout, side, store) if config.guards else None
    recorder = None
    if debug:
        recorder = Recorder(rank, world, side, config.timeout, store)
        recorder.install()
        if watch is not None:
            watch.recorder = recorder
    return GuardSession(watch, recorder)
