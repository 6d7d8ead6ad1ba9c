"""The file trackers: ``metrics.jsonl`` (plus ``config.json``) and ``metrics.csv`` in run_dir."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["JsonlTracker", "CsvTracker", "JSONL_NAME", "CSV_NAME", "CONFIG_NAME"]

JSONL_NAME = "metrics.jsonl"
CSV_NAME = "metrics.csv"
CONFIG_NAME = "config.json"


class JsonlTracker:
    """One JSON object per ``run.log`` call; the hyperparameters in ``config.json``."""

    name = "jsonl"

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._params: dict[str, object] = {}

    def log_params(self, params: Mapping[str, object]) -> None:
        self._params.update(params)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / CONFIG_NAME
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self._params, indent=1, sort_keys=True) + "\n",
                       encoding="utf-8")
        os.replace(tmp, path)

    def log_metrics(self, record: Mapping[str, int | float], step: int) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / JSONL_NAME, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(record), allow_nan=True) + "\n")

    def close(self) -> None:
        pass


class CsvTracker:
    """One row per call; a new name widens the header once (the file is rewritten atomically)."""

    name = "csv"

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / CSV_NAME
        self._header: list[str] | None = None

    def log_params(self, params: Mapping[str, object]) -> None:
        pass  # a table of metrics has no place for them; the jsonl tracker keeps config.json

    def log_metrics(self, record: Mapping[str, int | float], step: int) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if self._header is None:  # first write, maybe into a resumed run's file
            self._header = _read_header(path)
        header = self._header
        new = [k for k in record if k not in header]
        if header and new:
            header = header + new
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=header)
                writer.writeheader()
                writer.writerows(rows)
            os.replace(tmp, path)
        elif not header:
            header = list(record)
            with open(path, "w", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, fieldnames=header).writeheader()
        self._header = header
        with open(path, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, fieldnames=header).writerow(dict(record))

    def close(self) -> None:
        pass


def _read_header(path: Path) -> list[str]:
    if not path.exists() or path.stat().st_size == 0:
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])
