"""Cost model of data-parallel training: ring all-reduce with DDP's bucketing and overlap.

One ring all-reduce of ``b`` bytes over ``N`` devices takes (alpha-beta model)

    t = 2(N-1)·alpha + 2(N-1)/N · b / B

where alpha is the per-message latency and B the bandwidth of the slowest link in the ring.
DDP splits the gradients into buckets (the first one small, then ``bucket_cap_mb`` each) and
starts each bucket's all-reduce as soon as backward has produced it, so communication
hides behind the rest of backward; what is left after backward ends is "exposed" and adds
to the step time:

    step(N) = s·c + o + exposed(buckets, backward = f·s·c)

with s the single-device step, f the backward share of it, and three measured terms:

- ``c`` (``compute_scale``): per-device compute at N > 1 devices over the single-device
  step. 1 on separate devices. Where the N processes share cores, memory bandwidth or
  the backend's progress threads (N processes on one CPU host), each one computes
  slower; c is then measured as the median of the slowest of N ranks training at once
  without gradient sync, over the 1-process step (a synchronised step waits for the
  slowest rank, so the slowest is what counts).
- ``alpha`` as a training step pays it: a message sent after a stretch of compute, when
  the backend's threads and the peer have gone idle and must be woken, not a message in
  a back-to-back loop that keeps them spinning. ``splitsync plan --network measured`` and
  ``splitsync bench`` fit alpha and B to all-reduces timed between compute
  (:func:`splitsync.bench.measure.comm_between_compute`); on a shared 2-core host this
  alpha is 2-4x the back-to-back one, and grows with the compute between calls (the
  longer the peer sleeps, the longer it takes to wake), so the sweep computes the
  single-device step between calls. Presets are nominal link figures.
- ``o`` (``sync_overhead``): DDP's own per-step CPU work at N > 1: the reducer's autograd
  hooks, bucket bookkeeping, handing each bucket to the backend's thread and waking the
  trainer when it is done. Measured without any peer as the step of DDP on a 1-process
  group minus the bare step (0.3-0.45 ms per step on a 2-core CPU host; small against a GPU step
  of tens of ms, decisive for a 0.5 ms step).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Network", "NETWORKS", "Prediction", "ring_allreduce_time", "bus_bandwidth",
    "ddp_buckets", "exposed_comm", "predict", "predict_many", "fit_network",
    "parse_count", "DTYPE_BYTES", "advice", "PLAN_SIZES", "TRAIN_COMM_SIZES",
]

PLAN_SIZES: tuple[int, ...] = (1, 2, 8, 64, 512, 4096)
# Message sizes of the training-pattern all-reduce sweep (bytes): a latency-bound end and
# the sizes of DDP's first (1 MiB) and later buckets.
TRAIN_COMM_SIZES: tuple[int, ...] = (1024, 32 * 1024, 256 * 1024, 1024**2, 4 * 1024**2)
DTYPE_BYTES = {"fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2,
               "float16": 2, "fp64": 8, "float64": 8, "fp8": 1}
FIRST_BUCKET_MB = 1.0  # DDP's torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
GB = 1e9
MIB = 1024 * 1024


@dataclass(frozen=True)
class Network:
    """An interconnect: per-direction bandwidth of the ring's slowest link, and latency."""

    name: str
    bandwidth: float  # bytes/s
    latency: float  # seconds per message (alpha)
    note: str = ""

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and self.latency >= 0):
            raise ValueError(f"network {self.name!r}: bandwidth must be > 0 and latency >= 0.")


# Nominal per-direction link figures; real all-reduce bus bandwidth reaches about 70-90%.
NETWORKS: dict[str, Network] = {n.name: n for n in (
    Network("nvlink4", 450 * GB, 3e-6, "NVLink 4 (H100/H200 SXM), 900 GB/s bidirectional"),
    Network("nvlink3", 300 * GB, 3e-6, "NVLink 3 (A100 SXM), 600 GB/s bidirectional"),
    Network("pcie5", 64 * GB, 5e-6, "PCIe 5.0 x16 between GPUs of one host"),
    Network("pcie4", 32 * GB, 5e-6, "PCIe 4.0 x16 between GPUs of one host"),
    Network("ib-400g", 50 * GB, 5e-6, "InfiniBand NDR 400 Gb/s per GPU, RDMA"),
    Network("ib-200g", 25 * GB, 5e-6, "InfiniBand HDR 200 Gb/s per GPU, RDMA"),
    Network("eth-100g", 12.5 * GB, 20e-6, "100 Gb/s Ethernet (RoCE or TCP)"),
    Network("eth-25g", 3.125 * GB, 30e-6, "25 Gb/s Ethernet, TCP"),
    Network("eth-10g", 1.25 * GB, 50e-6, "10 Gb/s Ethernet, TCP"),
)}


@dataclass(frozen=True)
class Prediction:
    """Predicted figures of one data-parallel step at ``n`` devices."""

    n: int
    step_time: float  # seconds
    comm_time: float  # all buckets' all-reduce time, overlapped or not
    exposed: float  # communication time not hidden behind backward
    efficiency: float  # single-device step / step at n (weak scaling, fixed per-device batch)
    throughput: float  # samples/s if a per-device batch was given, else steps/s x n

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "step_time_s": self.step_time, "comm_time_s": self.comm_time,
                "exposed_comm_s": self.exposed, "efficiency": self.efficiency,
                "throughput": self.throughput}


def ring_allreduce_time(nbytes: float, n: int, net: Network) -> float:
    """Seconds for one ring all-reduce of ``nbytes`` over ``n`` devices."""
    if n < 1:
        raise ValueError(f"n={n}: the number of devices must be >= 1.")
    if n == 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * net.latency + 2 * (n - 1) / n * nbytes / net.bandwidth


def bus_bandwidth(nbytes: float, seconds: float, n: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) in bytes/s, as nccl-tests defines them."""
    algbw = nbytes / seconds
    return algbw, algbw * (2 * (n - 1) / n if n > 1 else 1.0)


def ddp_buckets(grad_bytes: float, bucket_cap_mb: float = 25.0,
                first_bucket_mb: float = FIRST_BUCKET_MB) -> list[float]:
    """Bucket sizes in the order backward fills them: a small first bucket, then full ones."""
    if grad_bytes <= 0:
        return []
    first = min(grad_bytes, first_bucket_mb * MIB)  # DDP counts bucket caps in MiB
    buckets = [first]
    rest = grad_bytes - first
    while rest > 0:
        buckets.append(min(rest, bucket_cap_mb * MIB))
        rest -= buckets[-1]
    return buckets


def exposed_comm(buckets: Sequence[float], n: int, net: Network, backward_time: float,
                 overlap: bool = True) -> tuple[float, float]:
    """(total all-reduce time, time left after backward) for buckets reduced one after another.

    Gradients are assumed to become ready uniformly over backward (by bytes): bucket k is
    ready when its last byte is. Without overlap every all-reduce waits for backward's end.
    """
    total_bytes = sum(buckets)
    finish = 0.0
    ready_bytes = 0.0
    total = 0.0
    for b in buckets:
        ready_bytes += b
        ready = backward_time * ready_bytes / total_bytes if overlap else backward_time
        t = ring_allreduce_time(b, n, net)
        total += t
        finish = max(finish, ready) + t
    return total, max(0.0, finish - backward_time) if buckets else 0.0


def predict(step_time: float, grad_bytes: float, n: int, net: Network, *,
            backward_fraction: float = 0.6, overlap: bool = True, bucket_cap_mb: float = 25.0,
            batch_size: int | None = None, compute_scale: float = 1.0,
            sync_overhead: float = 0.0) -> Prediction:
    """Step time at ``n`` devices from the single-device ``step_time`` (seconds).

    ``compute_scale`` is the per-device compute at ``n`` > 1 over ``step_time`` (1 on
    separate devices; measured above 1 when processes share a host's cores);
    ``sync_overhead`` DDP's own per-step CPU work in seconds at ``n`` > 1.
    """
    if step_time <= 0:
        raise ValueError(f"step_time={step_time!r}: give the single-device step time in seconds.")
    if not 0 < backward_fraction <= 1:
        raise ValueError(f"backward_fraction={backward_fraction}: must be in (0, 1].")
    if not compute_scale > 0:
        raise ValueError(f"compute_scale={compute_scale}: must be > 0 (1 on separate devices).")
    if not sync_overhead >= 0:
        raise ValueError(f"sync_overhead={sync_overhead}: must be >= 0 seconds.")
    compute = step_time * (compute_scale if n > 1 else 1.0)
    buckets = ddp_buckets(grad_bytes, bucket_cap_mb)
    comm, exposed = exposed_comm(buckets, n, net, backward_fraction * compute, overlap)
    step = compute + exposed + (sync_overhead if n > 1 else 0.0)
    per_step = batch_size if batch_size is not None else 1
    return Prediction(n, step, comm, exposed, step_time / step, n * per_step / step)


def predict_many(step_time: float, grad_bytes: float, net: Network,
                 sizes: Sequence[int] = PLAN_SIZES, **kwargs: object) -> list[Prediction]:
    """:func:`predict` for each device count in ``sizes``."""
    return [predict(step_time, grad_bytes, n, net, **kwargs) for n in sizes]  # type: ignore[arg-type]


def fit_network(nbytes: Sequence[float], seconds: Sequence[float], n: int,
                name: str = "measured") -> Network:
    """Fit alpha and B of the ring model to measured all-reduce times (least squares)."""
    if n < 2 or len(nbytes) < 2 or len(nbytes) != len(seconds):
        raise ValueError("fit_network needs n >= 2 and at least two (bytes, seconds) pairs.")
    # Weighted least squares on t = a + s*x with weights 1/t^2 (relative error), so the
    # small messages pin the latency and the large ones the bandwidth.
    xs = [2 * (n - 1) / n * b for b in nbytes]
    ws = [1.0 / (t * t) for t in seconds]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    my = sum(w * y for w, y in zip(ws, seconds, strict=True)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, seconds, strict=True)) / sxx
    intercept = my - slope * mx
    if slope <= 0:
        raise ValueError("all-reduce times do not grow with size; cannot fit a bandwidth.")
    return Network(name, 1.0 / slope, max(0.0, intercept) / (2 * (n - 1)),
                   f"fitted to {len(nbytes)} all-reduce sizes at {n} processes")


_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}


def parse_count(text: str | int | float) -> int:
    """'124M' -> 124_000_000; '1.5B' or '1.5G' -> 1_500_000_000; plain numbers pass."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgbt]?)\s*", text.lower())
        if not m:
            raise ValueError(f"parameter count {text!r}: write a number such as 124M, 7B or 3.5e6.")
        value = float(m.group(1)) * _SUFFIX[m.group(2)]
    if value <= 0 or not math.isfinite(value):
        raise ValueError(f"parameter count {text!r} must be positive.")
    return int(round(value))


def advice(preds: Sequence[Prediction], params: int, grad_bytes: float, *,
           net: Network, step_time: float, memory_gb: float | None = None,
           state_bytes_per_param: float = 16.0, **predict_kwargs: object) -> list[str]:
    """When gradient compression or FSDP would pay off, in plain sentences.

    Compression is judged by predicting the step again with half the gradient bytes
    (bf16 compression); FSDP by whether weights, gradients and Adam state fit in memory.
    """
    notes: list[str] = []
    hit = next((p for p in preds if p.n > 1 and p.exposed > 0.1 * p.step_time), None)
    if hit is None:
        notes.append("Communication stays hidden behind backward at every size shown: "
                     "gradient compression would not pay off.")
    else:
        half = predict(step_time, grad_bytes / 2, hit.n, net, **predict_kwargs)  # type: ignore[arg-type]
        gain = 1 - half.step_time / hit.step_time
        share = f"{100 * hit.exposed / hit.step_time:.0f}%"
        if gain > 0.05:
            notes.append(
                f"From {hit.n} devices exposed communication is {share} of the step: bf16 "
                f"gradient compression (a DDP comm hook, half the bytes) would cut the step "
                f"by {100 * gain:.0f}% there ({1e3 * hit.step_time:.1f} -> "
                f"{1e3 * half.step_time:.1f} ms); PowerSGD by more.")
        else:
            notes.append(
                f"From {hit.n} devices exposed communication is {share} of the step, but it "
                "is latency-bound (many small messages): compression would not help; a larger "
                "per-device batch or gradient accumulation (fewer all-reduces per sample) would.")
    if memory_gb is not None:
        state_gb = params * state_bytes_per_param / 1e9
        if state_gb > 0.5 * memory_gb:
            notes.append(
                f"Model state is about {state_gb:.1f} GB ({state_bytes_per_param:g} bytes per "
                f"parameter: weights, gradients, Adam moments) against {memory_gb:g} GB per "
                "device: FSDP (strategy='fsdp') pays off by sharding it, at about 1.5x DDP's "
                "communication volume.")
        else:
            notes.append(
                f"Model state (~{state_gb:.2f} GB) fits in {memory_gb:g} GB per device with "
                "room for activations: FSDP would only add communication (about 1.5x DDP's).")
    return notes
