"""DDP's bucketed, overlapped all-reduce vs the lesson's naive scheme, and DataParallel vs DDP.

The naive loop averages gradients after backward with one ``all_reduce`` per parameter
("sum and average the gradients"), written here in the benchmark, not in the library.
Both loops run side by side in one launch on the same data; their final parameters are
compared. DataParallel vs DDP runs where two or more GPUs are visible (n/a otherwise).

    python benchmarks/naive_vs_ddp.py [--quick] [--out DIR] [any `splitsync bench` option]
"""

from __future__ import annotations

import sys

from splitsync.cli import main

if __name__ == "__main__":  # worker processes re-import this file: keep the guard
    raise SystemExit(main(["bench", "--sections", "naive,dp", "--procs", "2", *sys.argv[1:]]))
