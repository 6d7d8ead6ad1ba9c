"""All-reduce algorithm and bus bandwidth from 1 KiB to 64 MiB on the active backend, beside a memcpy of the same size measured in the same processes.

    python benchmarks/allreduce.py [--quick] [--out DIR] [any `splitsync bench` option]

Same as `splitsync bench --sections comm`; prints markdown tables and writes
results.json and PNG plots into --out (default: splitsync-bench).
"""

from __future__ import annotations

import sys

from splitsync.cli import main

if __name__ == "__main__":  # worker processes re-import this file: keep the guard
    raise SystemExit(main(["bench", "--sections", "comm", *sys.argv[1:]]))
