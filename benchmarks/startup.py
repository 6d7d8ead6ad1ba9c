"""Import time (import splitsync vs import torch) and launch-to-first-step time (splitsync run vs torchrun).

    python benchmarks/startup.py [--quick] [--out DIR] [any `splitsync bench` option]

Same as `splitsync bench --sections import,launch`; prints markdown tables and writes
results.json and PNG plots into --out (default: splitsync-bench).
"""

from __future__ import annotations

import sys

from splitsync.cli import main

if __name__ == "__main__":  # worker processes re-import this file: keep the guard
    raise SystemExit(main(["bench", "--sections", "import,launch", *sys.argv[1:]]))
