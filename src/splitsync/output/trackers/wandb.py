"""Weights & Biases: one wandb run per training run.

wandb's own settings win when set: ``WANDB_MODE`` (e.g. ``offline``: nothing leaves the
machine), ``WANDB_DIR``, ``WANDB_PROJECT``, ``WANDB_NAME``. Otherwise the run's files go
under ``<run_dir>`` and the project is "splitsync".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["WandbTracker"]


class WandbTracker:
    """``wandb.init`` once; ``config.update`` for hyperparameters; ``log(..., step=)``."""

    name = "wandb"

    def __init__(self, run_dir: Path | None) -> None:
        import wandb

        # Passed explicitly either way: wandb reads its environment once per process.
        directory = os.environ.get("WANDB_DIR") or None
        if directory is None and run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            directory = str(run_dir)
        self.run: Any = wandb.init(project=os.environ.get("WANDB_PROJECT", "splitsync"),
                                   dir=directory, reinit="create_new")

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=False)

    def log_metrics(self, record: Mapping[str, int | float], step: int) -> None:
        self.run.log({k: v for k, v in record.items() if k != "step"}, step=step)

    def close(self) -> None:
        self.run.finish()
