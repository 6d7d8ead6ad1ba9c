"""Rank 0's set of open trackers: one call fans out to all; a failing tracker is turned off.

A tracker that raises (its directory removed, a full disk, a server gone) is reported
once through the ``splitsync`` logger and dropped; training and the other trackers go on.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from splitsync.output.trackers import DEFAULT_LOGGERS, NEEDS_RUN_DIR, Tracker, flatten_params

__all__ = ["Trackers", "open_tracker"]

_log = logging.getLogger("splitsync")


def open_tracker(name: str, run_dir: Path | None) -> Tracker:
    """A new tracker of kind ``name`` (its package imported now)."""
    if name == "jsonl":
        from splitsync.output.trackers.files import JsonlTracker

        return JsonlTracker(run_dir)  # type: ignore[arg-type]
    if name == "csv":
        from splitsync.output.trackers.files import CsvTracker

        return CsvTracker(run_dir)  # type: ignore[arg-type]
    if name == "tensorboard":
        from splitsync.output.trackers.tensorboard import TensorBoardTracker

        return TensorBoardTracker(run_dir)  # type: ignore[arg-type]
    if name == "wandb":
        from splitsync.output.trackers.wandb import WandbTracker

        return WandbTracker(run_dir)
    if name == "mlflow":
        from splitsync.output.trackers.mlflow import MlflowTracker

        return MlflowTracker(run_dir)
    raise ValueError(f"unknown tracker {name!r}")


def chosen(loggers: Sequence[str] | None, run_dir: Path | None) -> list[str]:
    """The trackers to open: the default set keeps today's behaviour (TensorBoard when
    installed, nothing without run_dir); named ones without the run_dir they need fail."""
    if loggers is None:
        if run_dir is None:
            return []
        return [n for n in DEFAULT_LOGGERS
                if n != "tensorboard" or importlib.util.find_spec("tensorboard") is not None]
    if run_dir is None:
        needs = [n for n in loggers if n in NEEDS_RUN_DIR]
        if needs:
            raise ValueError(f"loggers {needs} write under run_dir: pass init(run_dir=...).")
    return list(loggers)


class Trackers:
    """The open trackers; each failure is reported once and that tracker is closed."""

    def __init__(self, names: Sequence[str], run_dir: Path | None,
                 report: Callable[[str], None] | None = None) -> None:
        self._report = report or _log.warning
        self._open: list[Tracker] = []
        self.recorded: dict[str, Any] = {}
        for name in names:
            tracker = self._guard(name, open_tracker, name, run_dir)
            if tracker is not _FAILED:
                self._open.append(tracker)

    @property
    def names(self) -> list[str]:
        """The trackers still writing."""
        return [t.name for t in self._open]

    def _guard(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # any tracker error: report it, keep training
            self._report(f"logger {name!r} failed ({type(exc).__name__}: {exc}); it is turned "
                         "off for the rest of this run, training and the other loggers go on.")
            return _FAILED

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self._open):
            if self._guard(tracker.name, getattr(tracker, method), *args) is _FAILED:
                self._open.remove(tracker)
                self._guard(tracker.name + " (closing)", _quiet_close, tracker)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record each hyperparameter once; a later different value is kept out, with a word."""
        flat = flatten_params(params)
        new = {k: v for k, v in flat.items() if k not in self.recorded}
        changed = sorted(k for k, v in flat.items() if k in self.recorded
                         and self.recorded[k] != v)
        if changed:
            self._report(f"log_config: {changed} were already recorded; trackers keep the "
                         "first value.")
        if new:
            self.recorded.update(new)
            self._each("log_params", new)

    def log_metrics(self, record: Mapping[str, int | float], step: int) -> None:
        """One record at ``step`` to every open tracker."""
        self._each("log_metrics", record, step)

    def close(self) -> None:
        """Close every tracker (errors reported, not raised)."""
        self._each("close")
        self._open.clear()


_FAILED = object()


def _quiet_close(tracker: Tracker) -> None:
    try:
        tracker.close()
    except Exception:  # it already failed once and was reported; closing is best effort
        pass
