"""``splitsync verify``: self-test of the installation, or a data-parallel check of a script."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

DESCRIPTION = (
    "Without a script: run collectives on every available backend, train a tiny model with 1 "
    "and with N processes and check the parameters are equal, and round-trip a checkpoint.\n"
    "With a script: run it for a few steps with 1 process at global batch B and with N "
    "processes at B/N each, then diff per-step losses and gradient norms, check the ranks' "
    "samples were disjoint and covered the data, that initial weights agreed and that "
    "set_epoch advanced; print what diverged first and the likely cause. Each run writes "
    "its checkpoints and run_dir in a temporary folder of its own: your directories are "
    "left as they were.\n"
    "--strategies A,B runs the script under each strategy at N processes, --accumulate K "
    "with K micro-batches per step against one batch K times larger, --resume N steps "
    "straight against N/2 steps, a checkpoint, and the rest resumed at N and at another "
    "world size (bit-equal at the same size). Modes given together share their launches. "
    "A check the script gives no way to make is shown as 'not checkable', never as FAIL."
)
EPILOG = (
    "examples:\n"
    "  splitsync verify                 # self-test with 2 processes\n"
    "  splitsync verify -n 4 --backend gloo\n"
    "  splitsync verify -n 2 examples/digits.py\n"
    "  splitsync verify -n 2 --steps 4 --batch 64 train.py --lr 3e-4\n"
    "  splitsync verify --strategies ddp,fsdp --accumulate 2 --resume train.py"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--nproc", type=int, default=2, metavar="N",
                        help="processes to compare with one (default 2)")
    parser.add_argument("--backend", action="append", default=None, metavar="NAME",
                        help="self-test only: backend to test (repeatable; default: all "
                             "available)")
    parser.add_argument("--steps", type=int, default=3,
                        help="script: optimizer steps per epoch (default 3)")
    parser.add_argument("--epochs", type=int, default=2, help="script: epochs (default 2)")
    parser.add_argument("--batch", type=int, default=None, metavar="B",
                        help="script: global batch (default: the script's per-process batch x "
                             "N, or its global batch when it divides by run.world_size)")
    parser.add_argument("--strategies", default=None, metavar="A,B",
                        help="script: compare these strategies at N processes (e.g. ddp,fsdp)")
    parser.add_argument("--accumulate", type=int, default=None, metavar="K",
                        help="script: K micro-batches per step against one batch K x larger")
    parser.add_argument("--resume", action="store_true",
                        help="script: straight run against a checkpoint half-way resumed at N "
                             "and at another world size")
    parser.add_argument("--resume-nproc", type=int, default=None, metavar="M",
                        help="script: the other world size --resume resumes at (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds before the runs are killed (default 300)")
    parser.add_argument("script", nargs="?", help="training script to check")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from splitsync.tools.verify.report import print_table

    console = Console()
    if args.nproc < 1:
        console.print(f"[red]-n {args.nproc}: give at least 1 process.[/]")
        return 2
    if args.script is None:
        from splitsync.tools.verify.selftest import selftest

        results = selftest(args.nproc, args.backend, args.timeout)
        title = "1 process" if args.nproc == 1 else f"1 and {args.nproc} processes"
        return 0 if print_table(f"splitsync verify ({title})", results, console) else 1
    if args.nproc < 2:
        console.print("[red]verify script.py compares 1 with N processes: give -n 2 or more.[/]")
        return 2
    if args.strategies or args.accumulate is not None or args.resume:
        return _modes(args, console)
    from splitsync.tools.verify.script import verify_script

    report = verify_script(args.script, args.script_args, args.nproc, args.steps, args.epochs,
                           args.batch, args.timeout)
    passed = print_table(f"splitsync verify {args.script} (1 vs {args.nproc} processes)",
                         report.results, console)
    if report.cause:
        console.print(f"[bold]likely cause:[/] {report.cause}")
    return 0 if passed else 1


def _modes(args: argparse.Namespace, console: Console) -> int:
    """--strategies / --accumulate / --resume: one table (and likely cause) per mode."""
    from splitsync.strategies import STRATEGY_NAMES
    from splitsync.tools.verify.modes import Plan, verify_modes
    from splitsync.tools.verify.report import print_table

    names = tuple(s.strip() for s in (args.strategies or "").split(",") if s.strip())
    unknown = [s for s in names if s not in STRATEGY_NAMES]
    if args.strategies is not None and (len(names) < 2 or unknown):
        what = f"unknown strategy {unknown[0]!r}" if unknown else "one strategy"
        console.print(f"[red]--strategies {args.strategies}: {what}; give two or more of "
                      f"{', '.join(STRATEGY_NAMES)}, comma-separated (e.g. ddp,fsdp).[/]")
        return 2
    if args.accumulate is not None and args.accumulate < 2:
        console.print(f"[red]--accumulate {args.accumulate}: give K of 2 or more.[/]")
        return 2
    if args.resume_nproc is not None and (args.resume_nproc < 1
                                          or args.resume_nproc == args.nproc):
        console.print(f"[red]--resume-nproc {args.resume_nproc}: give another world size "
                      f"than -n {args.nproc} (the resume at -n is always checked).[/]")
        return 2
    plan = Plan(args.nproc, names, args.accumulate or 1, args.resume, args.resume_nproc,
                args.steps, args.epochs, args.batch, args.timeout)
    passed = True
    for section in verify_modes(args.script, args.script_args, plan):
        passed = print_table(section.title, section.results, console) and passed
        if section.cause:
            console.print(f"[bold]likely cause:[/] {section.cause}")
    return 0 if passed else 1
