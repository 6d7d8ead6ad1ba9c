"""``splitsync check``: find data-parallel mistakes in scripts without running them."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = (
    "Read training scripts (never run or import them) and report the classic data-parallel "
    "mistakes: hard-coded CUDA, model and data on different devices, DataParallel, DDP without "
    "a process group, a training function nothing calls, unsharded data, set_epoch never "
    "called, no seed before the model, output on every rank, a host sync every step, "
    "accumulation without no_sync, BatchNorm without SyncBatchNorm, context managers called "
    "as statements, unseeded random splits and datasets, checkpoints written per machine, "
    "clipping before unscaling.\n\n"
    "A script is read together with the local modules it imports (and a helper module with "
    "the scripts that import it); their findings are reported too.\n\n"
    "Silence one line with `# splitsync: ignore[SS501]`, a whole file with "
    "`# splitsync: ignore-file[SS501]`.\n"
    "Exit status: 0 clean, 1 findings at or above --fail-on (default: error), 2 bad usage."
)
EPILOG = """examples:
  splitsync check train.py
  splitsync check examples/                      every *.py below, recursively
  splitsync check train.py --json                machine-readable findings
  splitsync check train.py --select SS3,SS401    only these codes (prefixes work)
  splitsync check train.py --ignore SS601 --fail-on warning
  splitsync check --list-rules
  splitsync check --explain SS301
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``splitsync check``."""
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="scripts or directories (searched recursively for *.py)")
    parser.add_argument("--json", action="store_true", help="print findings as JSON")
    parser.add_argument("--select", default="", metavar="CODES",
                        help="comma-separated codes or prefixes to check (default: all)")
    parser.add_argument("--ignore", default="", metavar="CODES",
                        help="comma-separated codes or prefixes to skip")
    parser.add_argument("--fail-on", choices=("error", "warning", "info"), default="error",
                        help="lowest severity that makes the exit status 1 (default: error)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="processes reading the files (default: one per core when there "
                        "are many files; 1: read them all in this process)")
    parser.add_argument("--list-rules", action="store_true", help="list every rule and exit")
    parser.add_argument("--explain", metavar="CODE", help="explain one rule and exit")


def _codes(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def main(args: argparse.Namespace) -> int:
    """Run the checker; the exit status follows ``--fail-on``."""
    from splitsync.check import check_paths, get_rule, select_rules
    from splitsync.check.model import SEVERITIES
    from splitsync.check.registry import gate, measured_text
    from splitsync.check.report import render_json, render_rules, render_text, rules_json

    if hasattr(sys.stdout, "reconfigure"):  # quoted source may not fit an ASCII console
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        rules = select_rules(_codes(args.select), _codes(args.ignore))
    except ValueError as err:
        print(f"splitsync check: {err}", file=sys.stderr)
        return 2
    if args.list_rules:
        if args.json:
            print(rules_json(rules))
        else:
            render_rules(rules)
        return 0
    if args.explain:
        try:
            rule = get_rule(args.explain)
        except KeyError as err:
            print(f"splitsync check: {err.args[0]}", file=sys.stderr)
            return 2
        declared = get_rule(rule.code, gated=False).severity
        _, why = gate(rule.code, declared)
        capped = f" (declared {declared}; {why})" if rule.severity != declared else ""
        print(f"{rule.code} {rule.name} ({rule.severity}): {rule.summary}\n\n{rule.explain}\n\n"
              f"Precision: {measured_text(rule.code)}\nSeverity: {rule.severity}{capped}. "
              "Below 95% measured precision a rule reports at most `info`; `error` needs "
              "findings on the corpus and no false positive.")
        return 0
    if args.jobs is not None and args.jobs < 1:
        print(f"splitsync check: --jobs {args.jobs}: give a number of processes >= 1 (1 reads "
              "every file in this process)", file=sys.stderr)
        return 2
    if not args.paths:
        print("splitsync check: give at least one script or directory, e.g. "
              "`splitsync check train.py` (see --help)", file=sys.stderr)
        return 2
    try:
        findings, files = check_paths(args.paths, rules, jobs=args.jobs)
    except FileNotFoundError as err:
        print(f"splitsync check: {err}", file=sys.stderr)
        return 2
    findings = [f for f in findings if f.code != "SS001" or _wanted(f.code, args)]
    if args.json:
        print(render_json(findings, files))
    else:
        render_text(findings, files)
    worst = SEVERITIES.index(args.fail_on)
    return 1 if any(SEVERITIES.index(f.severity) <= worst for f in findings) else 0


def _wanted(code: str, args: argparse.Namespace) -> bool:
    select, ignore = _codes(args.select.upper()), _codes(args.ignore.upper())
    return (not select or any(code.startswith(p) for p in select)) and not any(
        code.startswith(p) for p in ignore)
