"""``splitsync env``: a report of this machine to paste into a bug report."""

from __future__ import annotations

import argparse
import json

DESCRIPTION = """\
Print versions (Python, torch, CUDA, NCCL), devices with their memory, the available
communication backends, the detected launcher (torchrun, SLURM, MPI, Kubernetes or none),
this machine's network names and the environment variables that matter for distributed
training. Run it on every node when a multi-node job does not start."""

EPILOG = """\
examples:
  splitsync env                 human-readable report
  splitsync env --json          the same as JSON, for scripts
  srun --ntasks-per-node=1 splitsync env    one report per node of a SLURM allocation"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json``."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def main(args: argparse.Namespace) -> int:
    """Print the report; always succeeds on a working installation."""
    from splitsync.tools.envreport import collect, render_text

    report = collect()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=False, default=str))
    else:
        print(render_text(report))
    return 0
