"""Peak memory of a splitsync DDP run vs hand-written DDP loops on the same model.

    python benchmarks/memory.py [--world 2] [--width 1024] [--depth 8] [--steps 4] [--repeats 2]

Each variant runs in fresh processes (one per rank), variants interleaved, repeats reported
as medians. Figures per rank:

* CPU: ``peak RSS delta``: the process's peak resident set (``getrusage`` ru_maxrss) minus
  the peak right before the model was built (interpreter, torch and the process group are
  thus excluded). CPU allocator statistics do not exist in torch, so RSS is what we have.
* CUDA: ``torch.cuda.max_memory_allocated`` after the same steps (the delta from before the
  model was built).
* ``grad storage``: bytes of the distinct storages behind ``p.grad`` — with
  ``gradient_as_bucket_view`` they are DDP's buckets; without it they are a second set of
  tensors next to the (hidden) buckets.

The splitsync run should match the hand-written loop with ``gradient_as_bucket_view=True``
(target: within 5%); the loop without it shows what a second gradient copy costs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
from collections.abc import Callable

import torch
from torch import nn

VARIANTS = ("splitsync", "hand DDP (bucket view)", "hand DDP (no bucket view)")


def _net(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _grad_storage(model: nn.Module) -> tuple[int, int]:
    """(bytes, count) of the distinct storages behind the gradients."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        if p.grad is not None:
            s = p.grad.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values()), len(seen)


def _loop(model: nn.Module, opt: torch.optim.Optimizer, backward: Callable, step: Callable,
          steps: int, width: int, device: torch.device) -> None:
    x = torch.randn(32, width, device=device)
    for _ in range(steps):
        backward(model(x).square().mean())
        step(opt)


def measure(rank: int, world: int, variant: str, width: int, depth: int, steps: int) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import splitsync as ss

    if variant == "splitsync":
        run = ss.init(seed=0)
        device = run.device
        base = _peak_bytes(device)
        model = run.model(_net(width, depth))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        _loop(model, opt, run.backward, run.step, steps, width, device)
        run.close()
    else:
        device = (torch.device("cuda", rank) if torch.cuda.is_available()
                  else torch.device("cpu"))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        base = _peak_bytes(device)
        model = DDP(_net(width, depth).to(device),
                    device_ids=[rank] if device.type == "cuda" else None,
                    gradient_as_bucket_view=variant == "hand DDP (bucket view)")
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(o: torch.optim.Optimizer) -> None:
            o.step()
            o.zero_grad(set_to_none=True)

        _loop(model, opt, lambda loss: loss.backward(), step, steps, width, device)
        dist.destroy_process_group()
    return {"peak": _peak_bytes(device) - base, "device": device.type}


def _grads_after_backward(rank: int, world: int, variant: str, width: int,
                          depth: int) -> tuple[int, int]:
    """Distinct gradient storage right after a backward (before any zero_grad)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import splitsync as ss

    if variant == "splitsync":
        with ss.init(seed=0) as run:
            model = run.model(_net(width, depth))
            run.backward(model(torch.randn(4, width, device=run.device)).sum())
            return _grad_storage(model)
    dist.init_process_group("gloo")
    try:
        model = DDP(_net(width, depth), gradient_as_bucket_view=variant == VARIANTS[1])
        model(torch.randn(4, width)).sum().backward()
        return _grad_storage(model)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    from splitsync.testing import spawn

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    peaks: dict[str, list[float]] = {v: [] for v in VARIANTS}
    kind = "cpu"
    for _ in range(args.repeats):  # interleaved: A B C A B C
        for v in VARIANTS:
            res = spawn(measure, args.world, v, args.width, args.depth, args.steps, timeout=600)
            peaks[v].append(statistics.median(r["peak"] for r in res))
            kind = res[0]["device"]
    grads = {} if kind == "cuda" else {
        v: spawn(_grads_after_backward, args.world, v, args.width, args.depth, timeout=300)[0]
        for v in VARIANTS
    }
    params = sum(p.numel() * 4 for p in _net(args.width, args.depth).parameters())
    ref = statistics.median(peaks[VARIANTS[1]])
    metric = "max_memory_allocated delta" if kind == "cuda" else "peak RSS delta"
    n_params = len(list(_net(args.width, args.depth).parameters()))
    table = Table(title=f"Peak memory per rank: {args.world} ranks on {kind}, "
                        f"{params / 2**20:.1f} MiB fp32 parameters in {n_params} tensors, "
                        f"{metric}, median of {args.repeats}")
    table.add_column("variant")
    table.add_column("peak (MiB)", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("grad storages", justify="right")
    for v in VARIANTS:
        med = statistics.median(peaks[v])
        g = f"{grads[v][1]} ({grads[v][0] / 2**20:.1f} MiB)" if v in grads else "-"
        table.add_row(v, f"{med / 2**20:.1f}", f"{med / ref:.3f}x", g)
    Console(width=120).print(table)
    print("ratio: against the hand-written loop with gradient_as_bucket_view=True (target "
          "<= 1.05). Grad storages: distinct tensors behind p.grad; a few large ones are "
          "DDP's buckets (no second copy), one per parameter means separate gradients "
          "next to the buckets.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
