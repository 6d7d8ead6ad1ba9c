"""Time from a rank's mistake to the end of the job, for each way the ranks go out of step.

Launches ``tests/launcher/scripts/hang_kinds.py`` with each kind N times (default 5) under
``splitsync run`` and prints, per kind, the median seconds from the script's ``DIVERGED``
line (printed just before the mistake) to the launcher's exit, with the default
``desync_after`` (20 s) unless ``--desync-after`` is given. Say the load average with the
figures: the machine's load shifts them.

    PYTHONPATH=src python benchmarks/hang_times.py [--repeats 5] [--nproc 2]
        [--kinds skip,spin] [--launcher splitsync|torchrun] [--desync-after S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "launcher"))

from hangkit import KINDS, launch_kind  # noqa: E402 - the launcher tests' own kit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--launcher", default="splitsync", choices=["splitsync", "torchrun"])
    parser.add_argument("--desync-after", type=float, default=None)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.nproc} ranks under "
          f"{args.launcher}; desync_after "
          f"{args.desync_after if args.desync_after is not None else 'default'}", flush=True)
    print(f"{'kind':8} {'median s':>9} {'min':>6} {'max':>6}  exit codes", flush=True)
    for kind in args.kinds.split(","):
        times, codes = [], []
        for _ in range(args.repeats):
            ended = launch_kind(kind, args.nproc, args.launcher,
                                desync_after=args.desync_after, timeout=300)
            times.append(ended.after_divergence)
            codes.append(ended.returncode)
        print(f"{kind:8} {statistics.median(times):9.1f} {min(times):6.1f} {max(times):6.1f}"
              f"  {codes}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
