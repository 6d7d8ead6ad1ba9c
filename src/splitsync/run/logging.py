"""The run's logging part: ``run.log`` (one all-reduce, then rank 0's trackers) and
``run.log_config``.

Observers may ride on the all-reduce ``run.log`` already does (``Observer.log_extra``):
their numbers are averaged in the same collective, so a per-rank figure reaches every rank
without a collective of its own. With no observer doing so, ``run.log`` is the plain one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from splitsync.distributed.logs import forget_filter, show_repeats_once
from splitsync.distributed.rng import kept_rng
from splitsync.observe import Observer, overriding
from splitsync.output.metrics import (
    MetricsLog,
    average_metrics,
    average_metrics_with,
    weighted_metrics,
)
from splitsync.run.config import RunConfig

__all__ = ["Logging", "run_settings"]


def run_settings(config: RunConfig, world_size: int, seed: int, device: torch.device,
                 backend: str) -> dict[str, Any]:
    """splitsync's own settings of a run, as trackers record them."""
    c = config
    return {"world_size": world_size, "strategy": c.strategy, "precision": c.precision,
            "accumulate": c.accumulate, "seed": seed, "device": str(device),
            "backend": backend, "deterministic": c.deterministic, "debug": c.debug,
            "guards": c.guards}


class Logging:
    """Averaging, rank 0's trackers, and the observers of ``run.log``."""

    def __init__(self, config: RunConfig, device: torch.device, is_main: bool,
                 settings: Mapping[str, Any]) -> None:
        self.config = config
        self.device = device
        self.is_main = is_main
        self.settings = dict(settings)  # recorded once as hyperparameters, under "splitsync"
        self.metrics: MetricsLog | None = None
        self._riders: tuple[Observer, ...] = ()
        self._on_log: tuple[Observer, ...] = ()
        self._warnings_once = show_repeats_once()  # until close: a warning per step is noise

    def set_observers(self, observers: Sequence[Observer]) -> None:
        self._riders = overriding(observers, "log_extra")
        self._on_log = overriding(observers, "on_log")

    def log(self, metrics: Mapping[str, Any], count: Any = None) -> dict[str, int | float]:
        riders = self._riders if metrics or count is not None else ()
        if not riders and count is None:
            record = average_metrics(metrics, self.device)
        else:
            extras = [list(obs.log_extra()) for obs in riders]
            flat = [v for part in extras for v in part]
            record, means = (average_metrics_with(metrics, self.device, flat) if count is None
                             else weighted_metrics(metrics, count, self.device, flat))
            start = 0
            for obs, part in zip(riders, extras, strict=True):
                obs.on_log_extra(means[start:start + len(part)])
                start += len(part)
        if self.is_main:
            self._log().write(record)
        for obs in self._on_log:
            obs.on_log(record)
        return record

    def log_config(self, params: Mapping[str, Any]) -> None:
        if not isinstance(params, Mapping):
            raise TypeError(f"run.log_config(params) takes a dict of settings, got "
                            f"{type(params).__name__}.")
        if self.is_main:
            self._log().log_params(params)

    def _log(self) -> MetricsLog:
        if self.metrics is None:  # opened on first use: no run.log, no files
            with kept_rng():  # rank 0 alone, at a moment a resume moves: draw nothing
                self.metrics = MetricsLog(self.config.run_dir, loggers=self.config.loggers,
                                          params={"splitsync": self.settings})
        return self.metrics

    def close(self) -> None:
        forget_filter(self._warnings_once)
        if self.metrics is not None:
            self.metrics.close()
