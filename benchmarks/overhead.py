"""Per-step overhead of a splitsync loop vs a hand-written DDP loop and a bare loop (W1 tiny MLP, W2 digits CNN), interleaved in one launch; plus separate launches for contrast. Accelerate and Lightning Fabric join the table when installed.

    python benchmarks/overhead.py [--quick] [--out DIR] [any `splitsync bench` option]

Same as `splitsync bench --sections overhead,separate`; prints markdown tables and writes
results.json and PNG plots into --out (default: splitsync-bench).
"""

from __future__ import annotations

import sys

from splitsync.cli import main

if __name__ == "__main__":  # worker processes re-import this file: keep the guard
    raise SystemExit(main(["bench", "--sections", "overhead,separate", *sys.argv[1:]]))
