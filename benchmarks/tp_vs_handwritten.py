"""splitsync's TP step vs torchtitan-style hand-written ``parallelize_module`` code, side by side.

Both loops train the same transformer (examples/tp_transformer.py) on the same batches in one
launch, on the same mesh: the hand-written one builds the mesh with ``init_device_mesh``,
calls ``parallelize_module`` and ``fully_shard`` itself and steps with ``loss.backward()``,
``clip_grad_norm_`` and ``opt.step()``; the splitsync one is ``init(mesh=...)``,
``run.model(m, tp_plan=...)``, ``run.backward`` and ``run.step(opt, clip=...)``. Rank 0
prints the median step time of each, their ratio, and the largest weight difference.

    splitsync run -n 4 benchmarks/tp_vs_handwritten.py --tp 2 [--dim 512 --layers 4
        --seq 256 --batch 8 --steps 30 --warmup 5]

Take timings on a quiet machine (on GPUs: one process per GPU, NCCL); on a loaded CPU
they say only that both run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import splitsync as ss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from tp_transformer import Transformer, tp_plan  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batches(args: argparse.Namespace, dp_rank: int, dp_size: int,
             device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    per = args.batch // dp_size
    out = []
    for _ in range(args.warmup + args.steps):
        whole = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        out.append(whole[dp_rank * per:(dp_rank + 1) * per].to(device))
    return out


def _loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def _model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(0)
    return Transformer(args.vocab, args.dim, args.heads, args.layers, args.seq)


def _weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([(p.detach().full_tensor() if hasattr(p, "full_tensor")
                       else p.detach()).flatten().cpu() for p in model.parameters()])


def handwritten(args: argparse.Namespace, device: torch.device) -> tuple[list[float], Any]:
    """torchtitan's composition, written out: the mesh, TP, FSDP2 over dp, a plain loop."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    world = dist.get_world_size()
    dp = world // args.tp
    mesh = init_device_mesh(device.type, (dp, args.tp), mesh_dim_names=("dp_shard", "tp"))
    model = _model(args).to(device)
    parallelize_module(model, mesh["tp"], tp_plan())
    if dp > 1:
        for layer in model.layers:
            fully_shard(layer, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for i, tokens in enumerate(_batches(args, dist.get_rank() // args.tp, dp, device)):
        _sync(device)
        t0 = time.perf_counter()
        _loss(model, tokens).backward()
        # torchtitan clips per mesh and combines the norms (its clip_grad_norm_)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norms: dict[Any, list[torch.Tensor]] = {}
        for g in grads:
            norms.setdefault(getattr(g, "device_mesh", None), []).append(g)
        total = torch.stack([
            (lambda n: n.full_tensor() if hasattr(n, "full_tensor") else n)(
                torch.nn.utils.get_total_norm(gs)) for gs in norms.values()]).norm()
        coef = torch.clamp(1.0 / (total + 1e-6), max=1.0)
        torch._foreach_mul_([g.to_local() if hasattr(g, "to_local") else g for g in grads],
                            coef)
        opt.step()
        opt.zero_grad()
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return times, _weights(model)


def with_splitsync(args: argparse.Namespace) -> tuple[list[float], Any, int]:
    with ss.init(seed=0, mesh={"dp_shard": -1, "tp": args.tp}) as run:
        model = run.model(_model(args), tp_plan=tp_plan())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        times = []
        for i, tokens in enumerate(_batches(args, run.dp_rank, run.dp_size, run.device)):
            _sync(run.device)
            t0 = time.perf_counter()
            run.backward(_loss(model, tokens))
            run.step(opt, clip=1.0)
            _sync(run.device)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        return times, _weights(model), run.rank


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="sequences per step, in all")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    # one group for both loops: formed here, found (and left up) by ss.init
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    theirs, hand = handwritten(args, device)
    ours, mine, rank = with_splitsync(args)
    if rank == 0:
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"tp {args.tp}, world {dist.get_world_size()}, dim {args.dim}, layers "
              f"{args.layers}, seq {args.seq}, batch {args.batch}: median step splitsync "
              f"{a * 1e3:.2f} ms, hand-written {b * 1e3:.2f} ms, ratio {a / b:.3f}; "
              f"max weight difference {float((mine - hand).abs().max()):.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
