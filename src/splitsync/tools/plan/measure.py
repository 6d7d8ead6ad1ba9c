"""What ``splitsync plan`` measures here: a model's single-device step, and the network's
alpha and B fitted to all-reduces timed between compute (``--measure``, ``--network
measured``). ``splitsync bench`` times its training-pattern sweep with the same code."""

from __future__ import annotations

import time
from statistics import median
from typing import Any

import torch

__all__ = ["measure_step", "measure_network", "comm_rank", "comm_between_compute",
           "train_rounds", "COMPUTE_GAP_S"]

# Compute before each all-reduce in the training-pattern sweep when no step time is known;
# otherwise the single-device step is used, as in training (on a loaded host the cost of
# waking the idle peer grows with the time it spent idle).
COMPUTE_GAP_S = 1e-3


def _busy(seconds: float, a: torch.Tensor, sync: Any) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(a, a)
        sync()  # on a GPU, do not queue more work than the gap holds


def train_rounds(gap_s: float, sizes: int, budget: float = 1.5) -> int:
    """Rounds of :func:`comm_between_compute` filling about ``budget`` seconds (20 to 100)."""
    return max(20, min(100, int(budget / (sizes * (gap_s + 1e-3)))))


def comm_between_compute(sizes: list[int], device: torch.device, rounds: int = 100,
                         gap_s: float = COMPUTE_GAP_S) -> list[dict]:
    """All-reduce time per size when every rank computes ``gap_s`` seconds before each call.

    This is the pattern of training: between two steps' all-reduces the ranks compute, the
    backend's threads go idle and the first rank to arrive waits for the others. Per call
    the time counted is that of the rank that arrived last (the smallest of the ranks' call
    times), so waiting for a slower rank is left out: that belongs to the per-device step.
    No clock is compared across processes. Each round visits every size (in rotating
    order), so a machine whose load drifts affects all sizes alike and the fit stays sane.
    """
    import torch.distributed as dist

    world = dist.get_world_size()
    a = torch.randn(64, 64, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    bufs = [torch.ones(max(1, nbytes // 4), device=device) for nbytes in sizes]
    own: list[list[float]] = [[] for _ in sizes]
    dist.barrier()
    for buf in bufs:
        dist.all_reduce(buf)
    for r in range(rounds):
        for k in range(len(sizes)):
            i = (k + r) % len(sizes)
            _busy(gap_s, a, sync)
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(bufs[i])
            sync()
            own[i].append(time.perf_counter() - t0)
    mine = torch.tensor(own, dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    last = torch.stack([t.cpu() for t in every]).min(0).values  # the last rank to arrive
    return [{"bytes": buf.numel() * 4, "allreduce_s": float(last[i].median()), "gap_s": gap_s,
             "own_median_s": median(own[i]), "rounds": rounds, "world_size": world}
            for i, buf in enumerate(bufs)]




def comm_rank(rank: int, world_size: int, sizes: list[int],
              gap_s: float = COMPUTE_GAP_S) -> list[dict] | None:
    """All-reduce between compute, alone (for ``splitsync plan --network measured``)."""
    import splitsync

    torch.set_num_threads(1)
    with splitsync.init(seed=0, guards=False) as run:
        rows = comm_between_compute(sizes, run.device, train_rounds(gap_s, len(sizes)), gap_s)
        return rows if rank == 0 else None


def measure_step(model: Any, shape: tuple[int, ...], batch: int, steps: int = 10) -> float:
    """Median seconds of forward + backward + SGD step of ``model`` on random input."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, *shape, device=dev)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        out = model(x)
        (out if isinstance(out, torch.Tensor) else out[0]).float().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return median(times)


def measure_network(world: int = 2, gap_s: float = 1e-3) -> Any:
    """Fit alpha and B to all-reduce times of ``world`` local gloo processes.

    The all-reduces are timed between stretches of compute ``gap_s`` long (the step time),
    as in training (see :func:`comm_between_compute`), not back to
    back.
    """
    from splitsync.launch.spawn import spawn
    from splitsync.tools.plan.costmodel import TRAIN_COMM_SIZES, fit_network

    rows = spawn(comm_rank, world, list(TRAIN_COMM_SIZES), gap_s, timeout=300)[0]
    return fit_network([r["bytes"] for r in rows], [r["allreduce_s"] for r in rows], world,
                       name=f"measured (gloo, {world} local processes, between compute)")
