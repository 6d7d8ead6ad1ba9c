"""``splitsync ckpt``'s three actions, from the parsed command line, and what they print.
``commands/ckpt.py`` only parses the arguments and picks one."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["inspect_report", "verify_report", "convert_report"]


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def _holding(kind: str, name: str, d: Mapping[str, Any]) -> str:
    parts = [f"{kind:<10} {name}" + (f" ({d['type']})" if d.get("type") else "")]
    if "tensors" not in d:
        return parts[0]
    if kind == "optimizer":
        parts.append(f"trains {d['model']}; {', '.join(d['state_keys']) or 'no state'} for "
                     f"{d['params_with_state']} params" +
                     (f", lr {', '.join(f'{x:g}' for x in d['lr'])}" if d.get("lr") else ""))
    elif d["tensors"]:
        parts.append(f"{d['tensors']} tensors, {d['elements']:,} elements, "
                     f"{'/'.join(d['dtypes'])}")
    for key in ("last_epoch", "last_lr", "scale", "growth_tracker"):
        if key in d:
            parts.append(f"{key} {d[key]}")
    if d["tensors"]:
        parts.append(_size(d["bytes"]))
    return "  ".join(parts[:1]) + ": " + ", ".join(parts[1:]) if len(parts) > 1 else parts[0]


def _loader(pos: Mapping[str, Any]) -> str:
    if "offsets" in pos:  # a stream: a position per shard
        return f"epoch {pos.get('epoch', 0)}, stream positions in {len(pos['offsets'])} shards"
    return f"epoch {pos.get('epoch', 0)}, {pos.get('consumed', 0)} samples consumed"


def _render_step(s: Mapping[str, Any]) -> list[str]:
    head = f"{s['name']}  {s['status']}"
    if s["status"] in ("incomplete", "set aside"):
        why = ("a save in progress or killed; resume ignores it" if s["status"] == "incomplete"
               else "moved aside by a resume that found it damaged")
        return [f"{head} ({why})"]
    lines = [f"{head}, checksums {s['checksums']}"]
    lines += [f"  problem    {p}" for p in s["problems"]]
    if "step" not in s or "world_size" not in s:
        return lines
    who = s["strategy"] or ("strategy not recorded" + (" (sharded: FSDP2 / DTensor)"
                                                       if s["layout"] == "sharded" else ""))
    if s["strategy"] == "mixed":
        who = ", ".join(f"{m}: {n}" for m, n in s["strategies"].items())
    lines.append(f"  written by {who}, world size {s['world_size']}, torch {s['torch']}; "
                 f"layout {s['layout']}")
    loaders = "; ".join(map(_loader, s["loaders"])) or "none"
    lines.append(f"  position   step {s['step']}, epoch {s['epoch']}; loaders: {loaders}")
    lines.append(f"  size       {_size(s['bytes'])} in {len(s['files'])} files")
    for kind, named in s.get("holds", {}).items():
        for name, d in named.items():
            lines.append("  " + _holding(kind, name, d))
    rng = s["rng"]
    if "kinds" in rng:
        lines.append(f"  rng        {rng['ranks']} ranks: {', '.join(rng['kinds'])}; "
                     f"{rng['loader_generators']} loader generator(s) per rank")
    if s["extra"] or s.get("tensor_extra"):
        extras = [f"{k}={v!r}" for k, v in s["extra"].items()]
        extras += [f"{k} ({_size(v['bytes'])} of tensors)" for k, v in s["tensor_extra"].items()]
        lines.append(f"  extra      {', '.join(extras)}")
    return lines


def inspect_report(args: argparse.Namespace) -> int:
    """``inspect``: each step's summary (or JSON)."""
    from splitsync.ckpt.offline.inspect import summarize

    report = summarize(args.dir, args.step, args.quick)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(f"{report['path']}" + (f"  (latest: {report['latest']})" if report["latest"] else ""))
        for s in report["steps"]:
            print("\n".join(_render_step(s)))
    return 0


def verify_report(args: argparse.Namespace) -> int:
    """``verify``: each step checked against its manifest; 0 when every one verifies."""
    from splitsync.ckpt.offline import reading as offline

    loc = offline.locate(args.dir)
    found = offline.entries(loc)
    if args.step is not None:
        found = [e for e in found if e.step == args.step and e.status != "set aside"][:1]
        if not found:
            print(f"{loc.path}: there is no step {args.step}", file=sys.stderr)
            return 1
    results = []
    for e in found:
        if e.status == "committed" or args.step is not None or loc.only is not None:
            c, _ = offline.check(loc, e.name)
            results.append({"name": e.name, "where": loc.where(e.name), "ok": c.ok,
                            "problems": list(c.problems)})
        else:
            results.append({"name": e.name, "where": loc.where(e.name), "ok": None,
                            "problems": [], "status": e.status})
    checked = [r for r in results if r["ok"] is not None]
    ok = bool(checked) and all(r["ok"] for r in checked)
    if args.json:
        print(json.dumps({"path": loc.path, "ok": ok, "steps": results}, indent=1))
    else:
        for r in results:
            if r["ok"] is None:
                print(f"{r['where']}: {r['status']}, not a checkpoint (ignored)")
            elif r["ok"]:
                print(f"{r['where']}: ok")
            else:
                print(f"{r['where']}: FAILED: " + "; ".join(r["problems"]))
        if not checked:
            print(f"{loc.path}: no committed checkpoint to verify")
    return 0 if ok else 1


def convert_report(args: argparse.Namespace) -> int:
    """``convert``: the newest (or ``--step``) checkpoint as one safetensors file."""
    from splitsync.ckpt.offline.convert import convert

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = convert(args.dir, args.out, step=args.step, model=args.model,
                       optimizer=args.optimizer, optimizer_name=args.optimizer_name,
                       dtype=args.dtype, hf=args.hf, strip_prefix=args.strip_prefix)
    for w in caught:  # one line each, without Python's file:line prefix
        print(f"warning: {w.message}", file=sys.stderr)
    for where, why in done.skipped:
        print(f"skipped {where}: {why}", file=sys.stderr)
    print(f"wrote {done.out}: model {done.model!r} of {done.source} (step {done.step}), "
          f"{done.tensors} tensors, {_size(done.bytes)}")
    if done.dropped:
        print(f"  not tensors, left out: {', '.join(done.dropped)}")
    if done.optimizer:
        print(f"wrote {done.optimizer}: optimizer {done.optimizer_name!r} by parameter name")
    return 0
