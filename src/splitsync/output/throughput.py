"""Throughput: samples/s, tokens/s and model FLOPs utilisation (MFU) of a training loop.

::

    tp = Throughput(flops_per_sample=6 * n_params * seq_len, tokens_per_sample=seq_len,
                    device=run.device)
    for x, y in loader:
        ...
        tp.step(samples=x.shape[0])
    stats = tp.compute(run)        # summed over ranks when run.world_size > 1
    run.print(stats.summary())

MFU is achieved model FLOP/s over the device's peak. The peak is read from a table of bf16
dense tensor-core figures (no sparsity) for common GPUs, or given as ``peak_flops``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Throughput", "ThroughputStats", "PEAK_BF16_TFLOPS", "peak_flops_for", "aggregate"]

# Vendor datasheet figures, bf16 dense (without structured sparsity), TFLOP/s.
# Matched against torch.cuda.get_device_name() in order: more specific names first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM5 (reported as "H100 80GB HBM3")
    ("H800", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("RTX 4090", 165.0),
    ("RTX A6000", 155.0),
    ("RTX 3090", 71.0),
)


def peak_flops_for(device_name: str) -> float | None:
    """The bf16 dense peak in FLOP/s of a GPU by its name, or None when not in the table."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops * 1e12
    return None


def _device_peak(device: Any) -> float | None:
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_for(torch.cuda.get_device_name(dev))


@dataclass(frozen=True)
class ThroughputStats:
    """Rates over the measured window; ``world_size`` ranks summed when aggregated."""

    samples_per_s: float
    tokens_per_s: float | None
    flops_per_s: float | None
    mfu: float | None  # achieved FLOP/s over (world_size x peak), 0..1
    world_size: int = 1

    def summary(self) -> str:
        """One human line, e.g. ``1,234 samples/s, 5.0e+05 tokens/s, MFU 41.2%``."""
        parts = [f"{self.samples_per_s:,.1f} samples/s"]
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if self.flops_per_s is not None:
            parts.append(f"{self.flops_per_s / 1e12:.2f} TFLOP/s")
        if self.mfu is not None:
            parts.append(f"MFU {100 * self.mfu:.1f}%")
        if self.world_size > 1:
            parts.append(f"over {self.world_size} ranks")
        return ", ".join(parts)


class Throughput:
    """Counts samples between calls to :meth:`step` over a sliding window of steps.

    ``flops_per_sample`` (model FLOPs of forward + backward for one sample) enables
    FLOP/s and, with a known peak, MFU. ``tokens_per_sample`` enables tokens/s.
    """

    def __init__(self, *, flops_per_sample: float | None = None,
                 tokens_per_sample: int | None = None, device: Any = None,
                 peak_flops: float | None = None, window: int = 100,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if window < 1:
            raise ValueError(f"window={window}: give the number of steps to average, >= 1.")
        for name, value in (("flops_per_sample", flops_per_sample),
                            ("tokens_per_sample", tokens_per_sample),
                            ("peak_flops", peak_flops)):
            if value is not None and value <= 0:
                raise ValueError(f"{name}={value!r}: give a positive number or None.")
        self.flops_per_sample = flops_per_sample
        self.tokens_per_sample = tokens_per_sample
        self.peak_flops = peak_flops if peak_flops is not None else (
            _device_peak(device) if device is not None else None)
        self._clock = clock
        self._times: deque[float] = deque(maxlen=window + 1)
        self._samples: deque[int] = deque(maxlen=window + 1)
        self.start()

    def start(self) -> None:
        """Restart the window now (call after warm-up steps, e.g. after compilation)."""
        self._times.clear()
        self._samples.clear()
        self._times.append(self._clock())
        self._samples.append(0)

    def step(self, samples: int) -> None:
        """Record the end of a step that processed ``samples`` samples on this rank."""
        self._times.append(self._clock())
        self._samples.append(samples)

    @property
    def steps(self) -> int:
        """Steps in the current window."""
        return len(self._times) - 1

    def compute(self, run: Any = None) -> ThroughputStats:
        """Rates of this rank, or summed over ranks when ``run`` (a Run) spans several."""
        if self.steps < 1:
            raise RuntimeError("Throughput.compute() needs at least one step() after start().")
        elapsed = self._times[-1] - self._times[0]
        samples = sum(list(self._samples)[1:])
        rate = samples / elapsed if elapsed > 0 else float("inf")
        local = self._stats(rate, 1)
        if run is None or getattr(run, "world_size", 1) <= 1:
            return local
        total = float(run.sum(rate))  # aggregate throughput = sum over ranks
        return self._stats(total, int(run.world_size))

    def _stats(self, samples_per_s: float, world_size: int) -> ThroughputStats:
        tokens = None if self.tokens_per_sample is None else samples_per_s * self.tokens_per_sample
        flops = None if self.flops_per_sample is None else samples_per_s * self.flops_per_sample
        mfu = None
        if flops is not None and self.peak_flops is not None:
            mfu = flops / (self.peak_flops * world_size)
        return ThroughputStats(samples_per_s, tokens, flops, mfu, world_size)


def aggregate(stats: Sequence[ThroughputStats]) -> ThroughputStats:
    """Combine per-rank stats (e.g. from gather_object): rates add, MFU is averaged by peak."""
    if not stats:
        raise ValueError("aggregate() needs the stats of at least one rank.")
    samples = sum(s.samples_per_s for s in stats)
    tokens = None if any(s.tokens_per_s is None for s in stats) else sum(
        s.tokens_per_s for s in stats)  # type: ignore[misc]
    flops = None if any(s.flops_per_s is None for s in stats) else sum(
        s.flops_per_s for s in stats)  # type: ignore[misc]
    mfu = None
    if flops is not None and all(s.mfu for s in stats):
        peak_total = sum(s.flops_per_s / s.mfu for s in stats)  # type: ignore[operator]
        mfu = flops / peak_total
    return ThroughputStats(samples, tokens, flops, mfu, sum(s.world_size for s in stats))
