"""TensorBoard: scalars and the hyperparameters under ``<run_dir>/tensorboard``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TensorBoardTracker", "TENSORBOARD_DIR"]

TENSORBOARD_DIR = "tensorboard"


class TensorBoardTracker:
    """``torch.utils.tensorboard.SummaryWriter``; flushed after every record."""

    name = "tensorboard"

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer: Any = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR))

    def log_params(self, params: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        # Written into this run's own event file (add_hparams would start a sub-run).
        for summary in hparams(dict(params), {}):
            self.writer.file_writer.add_summary(summary)
        self.writer.flush()

    def log_metrics(self, record: Mapping[str, int | float], step: int) -> None:
        for name, value in record.items():
            if name != "step":
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
