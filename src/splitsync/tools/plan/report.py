"""``splitsync plan``'s three reports, from the parsed command line: step time and scaling
(:func:`step_report`), per-device memory (:func:`memory_report`, ``--memory``) and goodput
under failures (:func:`failures_report`, ``--failures``). ``commands/plan.py`` only parses
the arguments and picks one."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import replace
from typing import Any

from splitsync.tools.plan import costmodel
from splitsync.tools.plan.failures import FailureInputs, plan_failures
from splitsync.tools.tables import markdown_table

__all__ = ["step_report", "memory_report", "failures_report"]


def _fail(msg: str) -> SystemExit:
    return SystemExit(f"splitsync plan: {msg}")


def _load_model(path: str) -> Any:
    return _factory(path)()


def _network(args: argparse.Namespace, step: float) -> Any:
    from splitsync.tools.plan.costmodel import NETWORKS, Network
    from splitsync.tools.plan.measure import measure_network

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


def memory_report(args: argparse.Namespace) -> int:
    """``plan --memory``: the per-device bytes table (or JSON) of each strategy and size."""
    import torch

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
        if args.tp:
            plans += _tp_rows(args, shape, sizes, dtype, opt, kwargs)
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
          f"precision {args.precision}, {opt.__name__}; bytes per device (the most loaded one)"
          + ("; a TP group of t takes t x that batch as one replica" if args.tp else ""))
    print()
    print(markdown_table(["strategy", "N", "params", "grads", "optimizer", "activations",
                          "peak", "host", f"fits {args.memory_gb:g} GB" if args.memory_gb
                          else "fits"], rows))
    if args.memory_gb:
        fit = [f"{p.strategy} at {p.devices}" for p in plans if p.fits]
        print()
        print(f"- fit in {args.memory_gb:g} GB: " + (", ".join(fit) if fit else "none; add "
              "devices, +act-ckpt, +offload, --tp or a smaller per-device batch"))
        if fit:
            best = min((p for p in plans if p.fits), key=lambda p: (p.devices, p.peak_bytes))
            print(f"- fewest devices: {best.strategy} at {best.devices} "
                  f"({_size(best.peak_bytes)} peak)")
    return 0


def _tp_rows(args: argparse.Namespace, shape: tuple[int, ...], sizes: list[int], dtype: Any,
             opt: Any, kwargs: dict[str, Any]) -> list[Any]:
    """The ``tp{n}+fsdp`` rows of ``--tp``, with the plan ``--tp-plan`` names."""
    from splitsync.tools.plan import tensor

    tps = tensor.parse_tp(args.tp)
    if not any(n % t == 0 for t in tps for n in sizes):
        raise ValueError(f"--tp {args.tp}: no TP size divides a device count of --sizes "
                         f"{args.sizes}; give sizes that are multiples of it.")
    styles: Any = args.tp_plan
    if styles != "auto":
        styles = _factory(styles)
        styles = styles() if callable(styles) else styles
    try:
        # the same global batch as the data-parallel rows: a TP group of t devices takes
        # the t per-device batches as one replica's batch
        facts = {t: tensor.tp_facts(_factory(args.model), shape, args.batch_size * t, t, styles,
                                    input_dtype=dtype, precision=args.precision,
                                    optimizer=opt, optimizer_kwargs=kwargs) for t in tps}
    except TypeError as exc:  # a plan that is not {module path: ParallelStyle}
        raise ValueError(f"--tp-plan {args.tp_plan}: {exc}") from None
    return tensor.tp_plan(facts, sizes, memory_gb=args.memory_gb)


def step_report(args: argparse.Namespace) -> int:
    """``plan``: the predicted step time and scaling table (or JSON)."""
    from splitsync.tools.plan.measure import measure_step  # torch: only here

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


def failures_report(args: argparse.Namespace) -> int:
    if (args.mtbf_hours is None) == (args.mtbf_s is None):
        raise SystemExit("splitsync plan --failures: give the failure rate as --mtbf-hours H "
                         "or --mtbf-s S (per node).")
    if args.save_s is None or args.restart_s is None:
        raise SystemExit("splitsync plan --failures: give --save-s (a checkpoint's stall) and "
                         "--restart-s (a failure to training again).")
    mtbf = args.mtbf_s if args.mtbf_s is not None else args.mtbf_hours * 3600
    try:
        inputs = FailureInputs(
            nodes=args.nodes, mtbf=mtbf, save=args.save_s, restart=args.restart_s,
            step=args.step_s, groups=args.replica_groups, heartbeat=args.heartbeat_s,
            heal=args.heal_s, rejoin=args.rejoin_s, quorum=args.quorum_s,
            startup=args.startup_s, work=args.work_s, pattern=args.failure_pattern)
        plans = plan_failures(inputs, args.interval_s)
    except ValueError as exc:
        raise SystemExit(f"splitsync plan --failures: {exc}") from None
    if args.json:
        print(json.dumps({"inputs": inputs.__dict__, "plans": [p.as_dict() for p in plans]},
                         indent=2))
        return 0

    print(f"{inputs.nodes} node(s), a failure every {mtbf / inputs.nodes:,.0f}s of the job "
          f"({inputs.pattern}); checkpoint stall {inputs.save:g}s, restart {inputs.restart:g}s; "
          f"fault tolerant: {inputs.groups} replica groups, heartbeat {inputs.heartbeat:g}s")
    print()
    rows = [[p.mode, "never" if p.interval == float("inf") else f"{p.interval:,.1f}",
             f"{100 * p.goodput:.1f}%", f"{100 * p.job_goodput:.1f}%", f"{p.per_failure:,.1f}",
             p.note] for p in plans]
    print(markdown_table(["run", "checkpoint every (s)", "goodput", "job goodput",
                          "s lost per failure", "note"], rows))
    return 0
