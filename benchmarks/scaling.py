"""Throughput and parallel efficiency vs number of processes, with the cost model's prediction (the model behind splitsync plan) calibrated on this machine.

    python benchmarks/scaling.py [--quick] [--out DIR] [any `splitsync bench` option]

Same as `splitsync bench --sections overhead,comm,scaling`; prints markdown tables and writes
results.json and PNG plots into --out (default: splitsync-bench).
"""

from __future__ import annotations

import sys

from splitsync.cli import main

if __name__ == "__main__":  # worker processes re-import this file: keep the guard
    raise SystemExit(main(["bench", "--sections", "overhead,comm,scaling", *sys.argv[1:]]))
