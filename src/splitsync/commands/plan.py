"""``splitsync plan``: its options, and which report they ask for (the reports and the
measuring code: ``splitsync.tools.plan``)."""

from __future__ import annotations

import argparse

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
    _failure_arguments(parser)
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
    m.add_argument("--tp", default=None, metavar="SIZES",
                   help="also tensor-parallel layouts: comma-separated TP sizes (e.g. 2,4), each "
                   "at every --sizes count it divides, with FSDP2 over the rest; a TP group of t "
                   "devices trains t x --batch-size as one replica (the same global batch)")
    m.add_argument("--tp-plan", default="auto", metavar="MODULE:NAME",
                   help='the TP plan: a dict {module path: ParallelStyle} (or a function '
                   'returning one) at MODULE:NAME, or "auto" for a Hugging Face model\'s '
                   "base_model_tp_plan (default: auto)")


def _failure_arguments(parser: argparse.ArgumentParser) -> None:
    f = parser.add_argument_group(
        "failures (--failures: goodput and the best checkpoint interval, restart-based and "
        "fault tolerant)")
    f.add_argument("--failures", action="store_true",
                   help="predict goodput under failures instead of step time")
    f.add_argument("--nodes", type=int, default=1, help="nodes (machines) in the job")
    f.add_argument("--mtbf-hours", type=float, default=None, metavar="H",
                   help="mean time between failures of one node, hours")
    f.add_argument("--mtbf-s", type=float, default=None, metavar="S",
                   help="the same in seconds (instead of --mtbf-hours)")
    f.add_argument("--save-s", type=float, default=None, metavar="S",
                   help="seconds a checkpoint stalls training")
    f.add_argument("--restart-s", type=float, default=None, metavar="S",
                   help="seconds from a failure until the restarted job trains again")
    f.add_argument("--step-s", type=float, default=1.0, metavar="S", help="seconds per step")
    f.add_argument("--replica-groups", type=int, default=2, metavar="G",
                   help="replica groups of the fault-tolerant run (default: 2)")
    f.add_argument("--heartbeat-s", type=float, default=1.0, metavar="S",
                   help="the Lighthouse's heartbeat timeout (default: 1)")
    f.add_argument("--heal-s", type=float, default=0.2, metavar="S",
                   help="one live recovery (default: 0.2)")
    f.add_argument("--rejoin-s", type=float, default=None, metavar="S",
                   help="a failed group's restart and recovery (default: --restart-s)")
    f.add_argument("--quorum-s", type=float, default=0.0, metavar="S",
                   help="a quorum's cost per step (default: 0)")
    f.add_argument("--startup-s", type=float, default=0.0, metavar="S",
                   help="the first launch's start, paid once (with --work-s)")
    f.add_argument("--work-s", type=float, default=None, metavar="S",
                   help="the job's useful compute, seconds (default: long)")
    f.add_argument("--interval-s", type=float, default=None, metavar="S",
                   help="also predict at this checkpoint interval (training seconds)")
    f.add_argument("--failure-pattern", default="poisson", choices=("poisson", "periodic"),
                   help="failures at random (default) or at a fixed period")


def main(args: argparse.Namespace) -> int:
    """Dispatch to the report asked for (``splitsync.tools.plan.report``)."""
    from splitsync.tools.plan import report

    if args.memory:
        return report.memory_report(args)
    if args.failures:
        return report.failures_report(args)
    return report.step_report(args)
