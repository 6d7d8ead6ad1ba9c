"""MLflow: one MLflow run per training run, through ``mlflow.MlflowClient`` (no global state).

``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_NAME`` win when set; otherwise a local
store in ``<run_dir>/mlflow.db`` (SQLite: MLflow's own choice for a local store now that
its plain-directory store is frozen) and the experiment "splitsync". Read it back with
``MlflowClient(tracking_uri="sqlite:///<run_dir>/mlflow.db")`` or ``mlflow ui
--backend-store-uri`` with the same URI.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["MlflowTracker", "MLFLOW_DB", "tracking_uri"]

MLFLOW_DB = "mlflow.db"


def tracking_uri(run_dir: Path | None) -> str | None:
    """Where runs go: the user's setting, else a file store in run_dir (None: mlflow's own)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if run_dir is None:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(run_dir / MLFLOW_DB).resolve()}"


class MlflowTracker:
    """Parameters with ``log_batch``; metrics with their step; ended FINISHED on close."""

    name = "mlflow"

    def __init__(self, run_dir: Path | None) -> None:
        from mlflow import MlflowClient

        self.client: Any = MlflowClient(tracking_uri=tracking_uri(run_dir))
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "splitsync")
        experiment = self.client.get_experiment_by_name(name)
        exp_id = (experiment.experiment_id if experiment is not None
                  else self.client.create_experiment(name))
        self.run_id: str = self.client.create_run(exp_id).info.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):  # mlflow's limit per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, record: Mapping[str, int | float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in record.items() if k != "step"]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")
