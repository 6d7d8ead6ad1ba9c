"""One rank of the self-test (``python -m splitsync.commands.verify_worker``, started by verify)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

import splitsync
from splitsync.tools.verify.checks import check_backend, roundtrip_checkpoint, train_tiny

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m splitsync.commands.verify_worker")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", action="append", default=[])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with splitsync.init(seed=0, timeout=60) as run:
        results = []
        if run.world_size > 1:
            results += [check_backend(b, run.rank, run.world_size) for b in args.backend]
        model, opt = train_tiny(run)
        results.append(roundtrip_checkpoint(run, model, opt, args.out / "checkpoint"))
        if run.is_main:
            params = {k: v.detach().cpu() for k, v in run.unwrap(model).state_dict().items()}
            torch.save(params, args.out / "params.pt")
        (args.out / f"rank{run.rank}.json").write_text(json.dumps([asdict(r) for r in results]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
