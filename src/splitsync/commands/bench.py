"""``splitsync bench``: overhead, communication and scaling, each against a baseline."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
Measure what splitsync costs and what more processes buy, on this machine.

Every figure is a ratio to a baseline measured side by side in the same launch: loops run
in alternating blocks of steps (A B, B A, ...) and the ratio is the median over rounds of
the ratio of block medians, so the machine's drift cancels. Prints markdown tables; writes
results.json and PNG plots (with matplotlib) into --out."""

EPILOG = """\
examples:
  splitsync bench --quick                    overhead, all-reduce, naive vs DDP (~2 min)
  splitsync bench --out bench-results        the full set, with plots
  splitsync bench --sections overhead --workloads W1 --budget 30"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from splitsync.bench.suite import SECTIONS

    parser.add_argument("--quick", action="store_true",
                        help="short budgets; sections overhead, naive, comm, scaling")
    parser.add_argument("--out", type=Path, default=Path("splitsync-bench"), metavar="DIR",
                        help="folder for results.json and plots (default: splitsync-bench)")
    parser.add_argument("--sections", default=None, metavar="S,...",
                        help=f"comma-separated subset of: {', '.join(SECTIONS)}")
    parser.add_argument("--workloads", default="W1,W2", metavar="W,...",
                        help="W1 (tiny MLP) and/or W2 (digits CNN) (default: W1,W2)")
    parser.add_argument("--procs", default="1,2", metavar="N,...",
                        help="process counts to compare at (default: 1,2)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="seconds per interleaved comparison (default: 10, quick: 4)")
    parser.add_argument("--rounds", type=int, default=None, help="fixed rounds (instead of budget)")
    parser.add_argument("--block", type=int, default=None, help="fixed steps per block")
    parser.add_argument("--no-plots", action="store_true", help="do not write PNG plots")
    parser.add_argument("--no-guards", action="store_true",
                        help="measure splitsync with init(guards=False) (default: guards on)")
    parser.add_argument("--no-optional", action="store_true",
                        help="do not try accelerate / lightning fabric even if installed")


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"splitsync bench: --{what} {text!r}: give comma-separated integers.") from None
    if not values or min(values) < 1:
        raise SystemExit(f"splitsync bench: --{what} {text!r}: give integers >= 1.")
    return values


def options_from(args: argparse.Namespace):  # -> BenchOptions
    """BenchOptions from the parsed command line (validated)."""
    from dataclasses import replace

    from splitsync.bench.suite import SECTIONS, BenchOptions
    from splitsync.bench.workloads import WORKLOADS

    opts = BenchOptions.quick_defaults() if args.quick else BenchOptions()
    changes: dict = {"procs": _ints(args.procs, "procs"), "optional": not args.no_optional,
                     "guards": not args.no_guards}
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad or not workloads:
        raise SystemExit(f"splitsync bench: unknown workload(s) {bad}; choose from {WORKLOADS}.")
    changes["workloads"] = workloads
    if args.sections:
        sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
        bad = [s for s in sections if s not in SECTIONS]
        if bad:
            raise SystemExit(f"splitsync bench: unknown section(s) {bad}; choose from {SECTIONS}.")
        changes["sections"] = sections
    if args.budget is not None:
        if args.budget <= 0:
            raise SystemExit("splitsync bench: --budget must be a positive number of seconds.")
        changes["budget"] = args.budget
    if (args.rounds is None) != (args.block is None):
        raise SystemExit("splitsync bench: give --rounds and --block together.")
    if args.rounds is not None:
        changes.update(rounds=max(1, args.rounds), block=max(1, args.block))
    return replace(opts, **changes)


def main(args: argparse.Namespace) -> int:
    from splitsync.bench.plots import have_matplotlib, write_plots
    from splitsync.bench.report import render
    from splitsync.bench.suite import run_suite, write_results

    opts = options_from(args)
    res = run_suite(opts, echo=lambda s: print(s, flush=True))
    print()
    print(render(res), flush=True)
    path = write_results(res, args.out)
    print(f"results: {path}")
    if not args.no_plots:
        if have_matplotlib():
            for p in write_plots(res, args.out):
                print(f"plot: {p}")
        else:
            print("plots: skipped (matplotlib not installed; pip install 'splitsync[bench]')")
    return 0
