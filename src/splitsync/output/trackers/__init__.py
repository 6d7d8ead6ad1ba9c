"""Experiment trackers behind ``run.log``: JSONL, CSV, TensorBoard, Weights & Biases, MLflow.

``init(loggers=[...])`` picks them by name; by default ("jsonl", "csv" and "tensorboard"
when that package is installed) they write under ``run_dir``. Only rank 0 opens them.
Every tracker gets the run's configuration once, as hyperparameters, and every
``run.log`` record with its step. Nothing here imports a tracker's package until a
tracker of that kind is opened.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

__all__ = [
    "TRACKER_NAMES", "DEFAULT_LOGGERS", "EXTRAS", "Tracker", "check_loggers",
    "require_packages", "flatten_params",
]

TRACKER_NAMES: tuple[str, ...] = ("jsonl", "csv", "tensorboard", "wandb", "mlflow")
DEFAULT_LOGGERS: tuple[str, ...] = ("jsonl", "csv", "tensorboard")
# tracker name -> (module that must import, extra of splitsync that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
# trackers that write only under run_dir (the others have their own settings for where)
NEEDS_RUN_DIR = ("jsonl", "csv", "tensorboard")

Param = int | float | str | bool


class Tracker(Protocol):
    """What a tracker does; each call may raise, the fan-out reports it once."""

    name: str

    def log_params(self, params: Mapping[str, Param]) -> None:
        """Record hyperparameters (each name once)."""

    def log_metrics(self, record: Mapping[str, int | float], step: int) -> None:
        """Record one ``run.log`` record at ``step``."""

    def close(self) -> None:
        """Flush and close."""


def check_loggers(loggers: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """``loggers`` as a tuple of valid names (None: the default); unknown names are errors."""
    if loggers is None:
        return None
    names = (loggers,) if isinstance(loggers, str) else tuple(loggers)
    unknown = [n for n in names if n not in TRACKER_NAMES]
    if unknown or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"Unknown logger(s) {unknown or list(names)!r}. Valid loggers: "
            f"{', '.join(TRACKER_NAMES)}."
        )
    if len(set(names)) != len(names):
        raise ValueError(f"loggers={list(names)!r} names a logger twice.")
    return names


def require_packages(names: Iterable[str]) -> None:
    """Fail now, before training, when a chosen tracker's package is not installed."""
    for name in names:
        if name in EXTRAS and importlib.util.find_spec(EXTRAS[name][0]) is None:
            module, extra = EXTRAS[name]
            raise ImportError(
                f"loggers=[{name!r}] needs the {module} package, which is not installed. "
                f"Install it with: pip install 'splitsync[{extra}]'"
            )


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Param]:
    """Nested dicts become ``a.b`` names; values that are not plain scalars become strings."""
    out: dict[str, Param] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_params(value, prefix=f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out
