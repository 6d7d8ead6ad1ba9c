"""``run.log(**metrics)``: average over ranks, print once, append to files in the run directory.

Every rank must call ``run.log`` with the same names (it is a collective). All values travel
in one all-reduce. Rank 0 prints one line and hands the averaged record to the trackers
chosen with ``init(loggers=...)``; by default it appends to ``<run_dir>/metrics.jsonl`` and
``<run_dir>/metrics.csv``, and to TensorBoard under ``<run_dir>/tensorboard`` when the
``tensorboard`` package is installed.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist

from splitsync.distributed import comm
from splitsync.output.trackers.fanout import Trackers, chosen
from splitsync.output.trackers.files import CSV_NAME, JSONL_NAME

__all__ = ["average_metrics", "average_metrics_with", "weighted_metrics", "format_record",
           "MetricsLog", "JSONL_NAME", "CSV_NAME"]


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
    return average_metrics_with(metrics, device)[0]


def average_metrics_with(metrics: Mapping[str, Any], device: torch.device,
                         extra: Sequence[float] = ()) -> tuple[dict[str, Value], list[float]]:
    """:func:`average_metrics`, with ``extra`` numbers averaged in the same all-reduce.

    Other tools ride on the one collective ``run.log`` already does (the straggler report
    sends each rank's step time this way). Every rank must give as many extras; without
    metrics nothing is reduced and the extras come back as given.
    """
    names = sorted(metrics)  # the same order on every rank, whatever the call's order
    checked = {n: _check(n, metrics[n]) for n in names}
    if not names:
        return {}, list(extra)
    # One tensor, one collective; tensors are stacked on the device without a host sync.
    parts = [v.to(device) if isinstance(v, torch.Tensor) else
             torch.tensor(v, dtype=torch.float64, device=device) for v, _ in checked.values()]
    if extra:
        parts.append(torch.tensor(list(extra), dtype=torch.float64, device=device))
        flat = torch.cat([p.reshape(-1) for p in parts])
    else:
        flat = torch.stack(parts)
    mean = comm.reduce(flat, "mean", device)
    values = mean.tolist()  # type: ignore[union-attr]
    averaged = dict(zip(names, values[:len(names)], strict=True))
    out: dict[str, Value] = {}
    for name in metrics:  # keep the caller's order for display
        value = averaged[name]
        was_int = checked[name][1]
        out[name] = int(value) if was_int and math.isfinite(value) and value.is_integer() else value
    return out, values[len(names):]


def _kept(value: float, was_int: bool) -> Value:
    return int(value) if was_int and math.isfinite(value) and value.is_integer() else value


def weighted_metrics(metrics: Mapping[str, Any], count: Any, device: torch.device,
                     extra: Sequence[float] = ()) -> tuple[dict[str, Value], list[float]]:
    """``run.log(count=n, **metrics)``: each rank's metrics weigh by its ``n`` items, so a
    per-rank mean becomes the mean over every item; the record's ``count`` is the total.

    One all-reduce, as :func:`average_metrics_with` (``extra`` still averaged over ranks).
    A rank with ``n == 0`` adds nothing (its mean over no item may be NaN). When no rank
    has an item, the metrics are the plain average over ranks.
    """
    n, _ = _check("count", count)
    n = float(n)
    if not (math.isfinite(n) and n >= 0):
        raise ValueError(f"run.log(count={n!r}): the count of items must be finite and >= 0.")
    names = sorted(metrics)
    checked = {k: _check(k, metrics[k]) for k in names}
    values = torch.stack([v.to(device) if isinstance(v, torch.Tensor) else
                          torch.tensor(v, dtype=torch.float64, device=device)
                          for v, _ in checked.values()]) if names else \
        torch.zeros(0, dtype=torch.float64, device=device)
    weighted = values * n if n > 0 else torch.zeros_like(values)
    tail = torch.tensor([n, *extra], dtype=torch.float64, device=device)
    summed = comm.reduce(torch.cat([weighted, values, tail]), "sum", device)
    out = summed.tolist()  # type: ignore[union-attr]
    k = len(names)
    total = out[2 * k]
    world = dist.get_world_size() if comm.is_active() else 1
    means = [x / total for x in out[:k]] if total > 0 else [x / world for x in out[k:2 * k]]
    averaged = dict(zip(names, means, strict=True))
    record = {name: _kept(averaged[name], checked[name][1]) for name in metrics}
    record["count"] = _kept(total, True)
    return record, [x / world for x in out[2 * k + 1:]]


def _fmt(value: Value) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4g}"


def format_record(record: Mapping[str, Value]) -> str:
    """``epoch 3 | loss 0.1234 | acc 0.9722``."""
    return " | ".join(f"{k} {_fmt(v)}" for k, v in record.items())


class MetricsLog:
    """Rank 0's sinks: the console plus the chosen trackers (see splitsync.output.trackers).

    ``loggers=None`` keeps the default: JSONL, CSV and TensorBoard (when installed) under
    ``run_dir``, nothing but the console without one. Trackers open on the first write
    (or the first hyperparameters) and get ``params`` once.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None, stream: TextIO | None = None,
                 echo: bool = True, loggers: Sequence[str] | None = None,
                 params: Mapping[str, Any] | None = None) -> None:
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.stream = stream
        self.echo = echo
        self.calls = 0
        self.loggers = loggers
        self._params = dict(params or {})
        self._trackers: Trackers | None = None

    @property
    def trackers(self) -> Trackers:
        """The open trackers (opened now if they are not yet)."""
        if self._trackers is None:
            self._trackers = Trackers(chosen(self.loggers, self.run_dir), self.run_dir)
            if self._params:
                self._trackers.log_params(self._params)
        return self._trackers

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Record hyperparameters with every tracker (each name once)."""
        self.trackers.log_params(params)

    def write(self, record: Mapping[str, Value]) -> None:
        """Print ``record`` and hand it to every tracker with its step.

        The step is the record's ``step`` when it has one, else the number of calls so far.
        """
        self.calls += 1
        if self.echo:
            print(format_record(record), file=self.stream, flush=True)
        if not record:
            return
        step = int(record["step"]) if "step" in record else self.calls
        self.trackers.log_metrics(record, step)

    def close(self) -> None:
        """Close every tracker that was opened."""
        if self._trackers is not None:
            self._trackers.close()
            self._trackers = None


