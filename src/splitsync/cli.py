"""``splitsync`` command line: a thin dispatcher; each subcommand lives in ``commands/``.

A command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and
``main(args) -> int``; it is imported only when chosen, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main", "COMMANDS"]

COMMANDS: dict[str, str] = {
    "run": "Launch a training script on N processes (torchrun underneath).",
    "env": "Print a report of this machine for bug reports (--json for machines).",
    "check": "Find data-parallel mistakes in scripts without running them.",
    "verify": "Self-test the installation, or check that a script is data-parallel-correct.",
    "bench": "Measure splitsync's overhead, communication and scaling.",
    "plan": "Predict step time and scaling efficiency at N devices.",
    "ckpt": "Inspect, convert (to safetensors / Hugging Face) and verify checkpoints offline.",
    "audit": "Check from a run's sample ledger that every sample was trained exactly once.",
    "goodput": "Show where a run's wall time went: steps that counted, lost ones, saves, restarts.",
}


def _module(name: str) -> object:
    return importlib.import_module(f"splitsync.commands.{name}")


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only the chosen subcommand's module is imported."""
    parser = argparse.ArgumentParser(
        prog="splitsync",
        description="Data-parallel PyTorch training on one or many devices and machines.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  splitsync run -n 2 train.py --lr 3e-4\n  splitsync env\n"
        "  splitsync check train.py\n  splitsync verify -n 2\n"
        "  splitsync ckpt inspect ckpt/",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        if name == chosen:
            mod = _module(name)
            p = sub.add_parser(name, help=help_text, description=getattr(mod, "DESCRIPTION", help_text),
                               epilog=getattr(mod, "EPILOG", None),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
            mod.add_arguments(p)  # type: ignore[attr-defined]
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _version() -> str:
    from splitsync import __version__

    return f"splitsync {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``splitsync`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    chosen = chosen if chosen in COMMANDS else None
    parser = build_parser(chosen)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(_module(args.command).main(args) or 0)  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
