"""``splitsync plan``: predict data-parallel step time and scaling at N devices."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

DESCRIPTION = """\
Predict step time, throughput and scaling efficiency of data-parallel (DDP) training at N
devices from a single-device step time, the gradient size and the interconnect.

Model: one ring all-reduce of b bytes over N devices takes 2(N-1)*alpha + 2(N-1)/N * b/B.
Gradients go out in DDP's buckets (1 MiB first, then --bucket-cap-mb) as backward produces
them, so communication overlaps the rest of backward; only what outlasts backward adds to
the step. Weak scaling: the per-device batch stays fixed. Measured terms: alpha and B
timed between compute, as a training step pays them (--network measured), and
--compute-scale, the per-device compute at N over the single-device step (1 on separate
devices; above 1 when the N processes share one host's cores), and --ddp-overhead-ms,
DDP's own per-step CPU work."""

EPILOG = """\
examples:
  splitsync plan --params 124M --step-ms 180 --network ib-400g --batch-size 16
  splitsync plan --params 7B --dtype bf16 --step-ms 900 --network eth-100g --memory-gb 80
  splitsync plan --model torchvision.models:resnet50 --input-shape 3,224,224 \\
                 --batch-size 32 --measure --network measured
  splitsync plan --params 25M --step-ms 40 --bandwidth 10 --latency 20
  splitsync plan --failures --nodes 512 --mtbf-hours 5000 --save-s 60 --restart-s 300 \
                 --step-s 2 --replica-groups 16
  splitsync plan --memory --model mypkg.nets:gpt_1b --input-shape 2048 --input-dtype long \
                 --batch-size 4 --precision bf16-mixed --memory-gb 80 --sizes 8,64 \
                 --strategies ddp,fsdp,fsdp+act-ckpt,hsdp+offload"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from splitsync.tools.plan.costmodel import NETWORKS, PLAN_SIZES

    g = parser.add_argument_group("gradient size (one of)")
    g.add_argument("--params", default=None, metavar="COUNT",
                   help="number of trainable parameters, e.g. 124M, 7B")
    g.add_argument("--model", default=None, metavar="MODULE:FACTORY",
                   help="import path of a model class or factory called without arguments")
    parser.add_argument("--dtype", default="fp32",
                        help="gradient dtype: fp32 (also for bf16-mixed), bf16, fp16 (default: fp32)")
    s = parser.add_argument_group("single-device step time (one of)")
    s.add_argument("--step-ms", type=float, default=None, help="measured elsewhere, in ms")
    s.add_argument("--measure", action="store_true",
                   help="time forward+backward+SGD of --model here on random input")
    parser.add_argument("--input-shape", default=None, metavar="D,...",
                        help="one sample's shape for --measure, e.g. 3,224,224")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="per-device batch: throughput in samples/s (and for --measure)")
    n = parser.add_argument_group("interconnect")
    n.add_argument("--network", default="ib-400g",
                   help=f"preset ({', '.join(NETWORKS)}) or 'measured' (gloo here) "
                   "(default: ib-400g)")
    n.add_argument("--bandwidth", type=float, default=None, metavar="GB/s",
                   help="per-direction link bandwidth, overrides the preset")
    n.add_argument("--latency", type=float, default=None, metavar="US",
                   help="per-message latency in microseconds, overrides the preset")
    parser.add_argument("--sizes", default=",".join(map(str, PLAN_SIZES)), metavar="N,...",
                        help="device counts (default: %(default)s)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size (MiB)")
    parser.add_argument("--backward-fraction", type=float, default=0.6,
                        help="share of the step spent in backward (default: 0.6)")
    parser.add_argument("--compute-scale", type=float, default=1.0, metavar="C",
                        help="per-device compute at N > 1 over the single-device step: 1 on "
                        "separate devices (default), measured when processes share cores")
    parser.add_argument("--ddp-overhead-ms", type=float, default=0.0, metavar="MS",
                        help="DDP's own per-step CPU work at N > 1 (reducer hooks, buckets); "
                        "splitsync bench measures it as DDP on a 1-process group minus a "
                        "bare step (default: 0)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="all-reduce only after backward (no overlap)")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="device memory in GB: whether FSDP would pay off; with --memory, "
                        "which strategies fit")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    from splitsync.commands.plan_failures import add_failure_arguments

    add_failure_arguments(parser)
    m = parser.add_argument_group("memory (--memory: per-device bytes of each strategy)")
    m.add_argument("--memory", action="store_true",
                   help="predict parameter, gradient, optimizer-state and activation bytes "
                   "per device (needs --model, --input-shape, --batch-size)")
    m.add_argument("--strategies", default="ddp,fsdp,fsdp+act-ckpt,fsdp+offload",
                   help="comma-separated: ddp, fsdp or hsdp, each with optional +offload "
                   "and +act-ckpt (default: %(default)s)")
    m.add_argument("--optimizer", default="AdamW",
                   help="torch.optim name or MODULE:CLASS (default: AdamW)")
    m.add_argument("--optimizer-args", default="{}", metavar="JSON",
                   help='keyword arguments of the optimizer, e.g. \'{"momentum": 0.9}\'')
    m.add_argument("--precision", default="32", help="32, bf16-mixed, 16-mixed or bf16-true")
    m.add_argument("--input-dtype", default="float32",
                   help="dtype of the input: float32 (default), long for token ids")
    m.add_argument("--gpus-per-node", type=int, default=8,
                   help="hsdp shards over this many devices (one node) (default: 8)")


def _fail(msg: str) -> SystemExit:
    return SystemExit(f"splitsync plan: {msg}")


def _load_model(path: str) -> Any:
    return _factory(path)()


def measure_step(model: Any, shape: tuple[int, ...], batch: int, steps: int = 10) -> float:
    """Median seconds of forward + backward + SGD step of ``model`` on random input."""
    import time

    import torch

    from splitsync.bench.harness import median

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


def _network(args: argparse.Namespace, step: float) -> Any:
    from dataclasses import replace

    from splitsync.tools.plan.costmodel import NETWORKS, Network

    if args.network == "measured":
        net = measure_network(gap_s=min(step, 0.05))
    elif args.network in NETWORKS:
        net = NETWORKS[args.network]
    else:
        raise _fail(f"--network {args.network!r}: choose one of {', '.join(NETWORKS)} or measured.")
    if args.bandwidth is not None:
        net = replace(net, name=f"{net.name}, custom", bandwidth=args.bandwidth * 1e9)
    if args.latency is not None:
        net = replace(net, name=f"{net.name}, custom", latency=args.latency * 1e-6)
    return Network(net.name, net.bandwidth, net.latency, net.note)  # re-validated


def measure_network(world: int = 2, gap_s: float = 1e-3) -> Any:
    """Fit alpha and B to all-reduce times of ``world`` local gloo processes.

    The all-reduces are timed between stretches of compute ``gap_s`` long (the step time),
    as in training (see :func:`splitsync.bench.measure.comm_between_compute`), not back to
    back.
    """
    from splitsync.bench.measure import comm_rank
    from splitsync.launch.spawn import spawn
    from splitsync.tools.plan.costmodel import TRAIN_COMM_SIZES, fit_network

    rows = spawn(comm_rank, world, list(TRAIN_COMM_SIZES), gap_s, timeout=300)[0]
    return fit_network([r["bytes"] for r in rows], [r["allreduce_s"] for r in rows], world,
                       name=f"measured (gloo, {world} local processes, between compute)")


def _factory(path: str) -> Any:
    """``MODULE:FACTORY``, imported as ``python -m`` would: the working directory first on
    the import path (the console script does not put it there by itself)."""
    mod_name, _, attr = path.partition(":")
    if not attr:
        raise _fail(f"--model {path!r}: write MODULE:FACTORY, e.g. mypkg.nets:Net.")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        return getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise _fail(f"--model {path!r}: cannot import it ({exc}), from {here} or the "
                    "installed packages.") from exc


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def memory_main(args: argparse.Namespace) -> int:
    """``plan --memory``: the per-device bytes table (or JSON) of each strategy and size."""
    import torch

    from splitsync.bench.harness import markdown_table
    from splitsync.tools.plan import memory

    if args.model is None or args.input_shape is None or args.batch_size is None:
        raise _fail("--memory needs --model MODULE:FACTORY, --input-shape D,... and "
                    "--batch-size (per device).")
    try:
        shape = tuple(int(d) for d in args.input_shape.split(",") if d.strip())
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        kwargs = json.loads(args.optimizer_args)
        variants = memory.parse_strategies(args.strategies)
        opt = memory.optimizer_class(args.optimizer)
        dtype = getattr(torch, args.input_dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"--input-dtype {args.input_dtype!r}: give a torch dtype name "
                             "such as float32 or long.")
        if not isinstance(kwargs, dict):
            raise ValueError(f"--optimizer-args {args.optimizer_args!r}: give a JSON object.")
        facts = memory.model_facts(_factory(args.model), shape, args.batch_size,
                                   input_dtype=dtype, precision=args.precision,
                                   optimizer=opt, optimizer_kwargs=kwargs)
        plans = memory.plan(facts, variants, sizes, memory_gb=args.memory_gb,
                            per_node=args.gpus_per_node)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if args.json:
        print(json.dumps([p.as_dict() for p in plans], indent=2))
        return 0
    rows = [[p.strategy, p.devices, *(_size(b) for b in (
             p.params_bytes, p.grads_bytes, p.optimizer_bytes, p.activations_bytes,
             p.peak_bytes, p.host_bytes)),
             "" if p.fits is None else ("yes" if p.fits else "no")] for p in plans]
    print(f"{facts.numel:,} parameters; batch {args.batch_size} x {shape} per device, "
          f"precision {args.precision}, {opt.__name__}; bytes per device (the most loaded one)")
    print()
    print(markdown_table(["strategy", "N", "params", "grads", "optimizer", "activations",
                          "peak", "host", f"fits {args.memory_gb:g} GB" if args.memory_gb
                          else "fits"], rows))
    if args.memory_gb:
        fit = [f"{p.strategy} at {p.devices}" for p in plans if p.fits]
        print()
        print(f"- fit in {args.memory_gb:g} GB: " + (", ".join(fit) if fit else "none; add "
              "devices, +act-ckpt, +offload or a smaller per-device batch"))
    return 0


def main(args: argparse.Namespace) -> int:
    from splitsync.bench.harness import markdown_table
    from splitsync.tools.plan import costmodel

    if args.memory:
        return memory_main(args)
    if args.failures:
        from splitsync.commands.plan_failures import failures_main

        return failures_main(args)

    if (args.params is None) == (args.model is None):
        raise _fail("give the gradient size as --params COUNT or --model MODULE:FACTORY.")
    if (args.step_ms is None) == (not args.measure):
        raise _fail("give the single-device step time as --step-ms MS or --measure.")
    if args.dtype not in costmodel.DTYPE_BYTES:
        raise _fail(f"--dtype {args.dtype!r}: choose one of {', '.join(costmodel.DTYPE_BYTES)}.")
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise _fail(f"--sizes {args.sizes!r}: give comma-separated integers.") from None
    model = _load_model(args.model) if args.model else None
    params = (sum(p.numel() for p in model.parameters() if p.requires_grad) if model is not None
              else costmodel.parse_count(args.params))
    if args.measure:
        if model is None or args.input_shape is None or args.batch_size is None:
            raise _fail("--measure needs --model, --input-shape and --batch-size.")
        shape = tuple(int(d) for d in args.input_shape.split(","))
        step = measure_step(model, shape, args.batch_size)
    else:
        if args.step_ms <= 0:
            raise _fail(f"--step-ms {args.step_ms}: give a positive time in milliseconds.")
        step = args.step_ms / 1e3
    if not args.ddp_overhead_ms >= 0:
        raise _fail(f"--ddp-overhead-ms {args.ddp_overhead_ms}: give a time >= 0 in ms.")
    if not args.compute_scale > 0:
        raise _fail(f"--compute-scale {args.compute_scale}: give a factor > 0 (1 on separate "
                    "devices; per-device step at N over the single-device step).")
    net = _network(args, step)
    grad = params * costmodel.DTYPE_BYTES[args.dtype]
    kw = {"backward_fraction": args.backward_fraction, "overlap": not args.no_overlap,
          "bucket_cap_mb": args.bucket_cap_mb, "batch_size": args.batch_size,
          "compute_scale": args.compute_scale, "sync_overhead": args.ddp_overhead_ms / 1e3}
    preds = costmodel.predict_many(step, grad, net, sizes, **kw)
    notes = costmodel.advice(preds, params, grad, net=net, step_time=step,
                             memory_gb=args.memory_gb, **kw)
    if args.json:
        print(json.dumps({"params": params, "grad_bytes": grad, "step_time_s": step,
                          "network": net.__dict__, "predictions": [p.as_dict() for p in preds],
                          "advice": notes}, indent=2))
        return 0
    unit = "samples/s" if args.batch_size else "steps/s x N"
    rows = [[p.n, f"{1e3 * p.step_time:.2f}", f"{1e3 * p.comm_time:.2f}",
             f"{1e3 * p.exposed:.2f}", f"{p.throughput:,.1f}", f"{100 * p.efficiency:.1f}%"]
            for p in preds]
    print(f"{params:,} parameters, {grad / 1e6:,.1f} MB of {args.dtype} gradients; "
          f"single-device step {1e3 * step:.2f} ms; network {net.name}: "
          f"{net.bandwidth / 1e9:g} GB/s, {net.latency * 1e6:g} us"
          + (f" ({net.note})" if net.note else ""))
    if args.compute_scale != 1.0 or args.ddp_overhead_ms:
        print(f"at N > 1: per-device compute x{args.compute_scale:g} (--compute-scale), "
              f"DDP's own work {args.ddp_overhead_ms:g} ms per step (--ddp-overhead-ms)")
    print()
    print(markdown_table(["N", "step ms", "all-reduce ms", "exposed ms", unit, "efficiency"], rows))
    print()
    for note in notes:
        print(f"- {note}")
    return 0
