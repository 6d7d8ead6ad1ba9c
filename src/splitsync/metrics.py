"""``run.log(**metrics)``: average over ranks, print once, append to files in the run directory.

Every rank must call ``run.log`` with the same names (it is a collective). All values travel
in one all-reduce. Rank 0 prints one line and appends the averaged record to
``<run_dir>/metrics.jsonl`` and ``<run_dir>/metrics.csv``, and to TensorBoard under
``<run_dir>/tensorboard`` when the ``tensorboard`` package is installed.
"""

from __future__ import annotations

import csv
import json
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import torch

from splitsync import comm

__all__ = ["average_metrics", "format_record", "MetricsLog", "JSONL_NAME", "CSV_NAME"]

JSONL_NAME = "metrics.jsonl"
CSV_NAME = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"

Value = int | float


def _check(name: str, value: Any) -> tuple[Any, bool]:
    """The value to reduce and whether it was a Python integer."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"run.log({name}=...) got a tensor of shape {tuple(value.shape)}; log a number "
                f"or a one-element tensor, e.g. {name}=t.mean()."
            )
        if value.is_complex():
            raise TypeError(f"run.log({name}=...) got a complex tensor; log a real number.")
        return value.detach().reshape(()).to(torch.float64), False
    if isinstance(value, bool):
        return float(value), False
    if isinstance(value, numbers.Integral):
        return float(value), True
    if isinstance(value, numbers.Real):
        return float(value), False
    raise TypeError(
        f"run.log({name}={value!r}): values must be numbers or one-element tensors, "
        f"not {type(value).__name__}."
    )


def average_metrics(metrics: Mapping[str, Any], device: torch.device) -> dict[str, Value]:
    """Every metric averaged over ranks, in one all-reduce; same result on every rank.

    Integers whose average is a whole number stay integers (an epoch number stays 3).
    """
    names = sorted(metrics)  # the same order on every rank, whatever the call's order
    checked = {n: _check(n, metrics[n]) for n in names}
    if not names:
        return {}
    # One tensor, one collective; tensors are stacked on the device without a host sync.
    parts = [v.to(device) if isinstance(v, torch.Tensor) else
             torch.tensor(v, dtype=torch.float64, device=device) for v, _ in checked.values()]
    mean = comm.reduce(torch.stack(parts), "mean", device)
    values = mean.tolist()  # type: ignore[union-attr]
    averaged = dict(zip(names, values, strict=True))
    out: dict[str, Value] = {}
    for name in metrics:  # keep the caller's order for display
        value = averaged[name]
        was_int = checked[name][1]
        out[name] = int(value) if was_int and math.isfinite(value) and value.is_integer() else value
    return out


def _fmt(value: Value) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4g}"


def format_record(record: Mapping[str, Value]) -> str:
    """``epoch 3 | loss 0.1234 | acc 0.9722``."""
    return " | ".join(f"{k} {_fmt(v)}" for k, v in record.items())


class MetricsLog:
    """Rank 0's sinks: console, JSONL, CSV, optional TensorBoard. Opened lazily."""

    def __init__(self, run_dir: str | os.PathLike[str] | None, stream: TextIO | None = None,
                 echo: bool = True) -> None:
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.stream = stream
        self.echo = echo
        self.calls = 0
        self._csv_header: list[str] | None = None
        self._tb: Any = None
        self._tb_tried = False

    def write(self, record: Mapping[str, Value]) -> None:
        """Print ``record`` and append it to every file sink."""
        self.calls += 1
        if self.echo:
            print(format_record(record), file=self.stream, flush=True)
        if self.run_dir is None or not record:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / JSONL_NAME, "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(record), allow_nan=True) + "\n")
        self._append_csv(record)
        self._tensorboard(record)

    def _append_csv(self, record: Mapping[str, Value]) -> None:
        path = self.run_dir / CSV_NAME  # type: ignore[operator]
        if self._csv_header is None:  # first write, maybe into a resumed run's file
            self._csv_header = _read_header(path)
        header = self._csv_header
        new = [k for k in record if k not in header]
        if header and new:
            # A new column: rewrite the file once with the wider header (atomic replace).
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
        self._csv_header = header
        with open(path, "a", newline="", encoding="utf-8") as f:
            csv.DictWriter(f, fieldnames=header).writerow(dict(record))

    def _tensorboard(self, record: Mapping[str, Value]) -> None:
        if not self._tb_tried:
            self._tb_tried = True
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional extra "tensorboard"; files above still get written
                return
            self._tb = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR))  # type: ignore[operator]
        if self._tb is None:
            return
        step = int(record["step"]) if "step" in record else self.calls
        for name, value in record.items():
            if name != "step":
                self._tb.add_scalar(name, value, step)
        self._tb.flush()

    def close(self) -> None:
        """Close the TensorBoard writer, if one was opened."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _read_header(path: Path) -> list[str]:
    if not path.exists() or path.stat().st_size == 0:
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])
