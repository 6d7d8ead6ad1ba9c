"""Tokens/s and MFU of a GPT-2-small-class model (124M parameters) trained through splitsync.

    python benchmarks/gpt_mfu.py                     # one GPU, bf16-mixed, compile off and on
    python benchmarks/gpt_mfu.py --size tiny --device cpu --precision 32 --steps 3

MFU = (6·N + 12·L·d·T) FLOPs per token x tokens/s / the device's bf16 dense peak
(989 TFLOP/s for H100 SXM and H200; see splitsync.output.throughput.PEAK_BF16_TFLOPS).
Data are random tokens: the figure is about the arithmetic, not about learning.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpt import SIZES, train_mfu

from splitsync.bench.harness import markdown_table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="124m")
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps (compilation happens here)")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--device", default=None, help="default: the first GPU, else cpu")
    p.add_argument("--compile", choices=("off", "on", "both"), default="both")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)

    rows = []
    for flag in {"off": [False], "on": [True], "both": [False, True]}[args.compile]:
        try:
            r = train_mfu(args.size, steps=args.steps, warmup=args.warmup, batch=args.batch,
                          compile=flag, precision=args.precision, device=args.device)
        except TypeError as exc:  # a splitsync without run.model(compile=...)
            r = {"compile": flag, "error": f"n/a: {exc}"}
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    table = [[r.get("size", args.size), r.get("device_name", ""), r.get("precision", args.precision),
              "on" if r["compile"] else "off", r.get("batch", ""),
              f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "n/a",
              f"{r['tflops_per_s']:.1f}" if r.get("tflops_per_s") else "n/a",
              f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a (peak unknown)",
              r.get("error", "")] for r in rows]
    print(markdown_table(["model", "device", "precision", "compile", "batch", "tokens/s",
                          "TFLOP/s", "MFU", "note"], table))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
