"""``splitsync ckpt``: inspect, convert and verify checkpoints offline, in one process."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Mapping
from typing import Any

HELP = "Inspect, convert (to safetensors / Hugging Face) and verify checkpoints offline."
DESCRIPTION = """\
Work with the checkpoints run.save writes, in one process, without a process group or a GPU.
DIR is the directory given to run.save / run.resume (holding step-NNNNNN/ folders) or one
step folder, a local path or an fsspec URL (s3://bucket/run, memory://..., file://...).
Every file is checked against the manifest's XXH3 checksums before anything in it is read,
and nothing is unpickled beyond torch.load(weights_only=True)."""
EPILOG = """\
examples:
  splitsync ckpt inspect ckpt/                 steps, who wrote them, what they hold
  splitsync ckpt inspect s3://bucket/run --json
  splitsync ckpt verify ckpt/                  exit code 0 when every checkpoint verifies
  splitsync ckpt convert ckpt/ model.safetensors --dtype bf16
  splitsync ckpt convert ckpt/ final/ --hf gpt2-config/ --optimizer final/optim.pt"""


_DIR = "checkpoint directory (as given to run.save) or one step folder; a path or a URL"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    ins = sub.add_parser("inspect", help="steps present, who wrote them, what they hold, sizes, "
                         "whether their checksums verify")
    _reader_arguments(ins)
    ins.add_argument("--quick", action="store_true",
                     help="check manifests and file sizes only, not checksums (reads no "
                          "file; what a step holds is listed by name)")
    conv = sub.add_parser("convert", help="one safetensors file of the full model weights",
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          description="Write the newest complete step (or --step N), sharded "
                          "(DCP, FSDP2) or not, as one safetensors file of the full model "
                          "weights, named as in the unwrapped module.")
    conv.add_argument("dir", metavar="DIR", help=_DIR)
    conv.add_argument("out", metavar="OUT", help="the .safetensors file to write (a folder "
                      "with --hf); a path or an fsspec URL")
    conv.add_argument("--step", type=int, default=None, metavar="N",
                      help="convert step N (default: the newest that verifies)")
    conv.add_argument("--model", default=None, metavar="NAME",
                      help="the registered model to write (default: the only one, or the one "
                           "the optimizers train), e.g. an EMA model")
    conv.add_argument("--optimizer", default=None, metavar="FILE",
                      help="also write the optimizer state by parameter name: .safetensors, or "
                           "a torch.save file (.pt) that loads with weights_only=True")
    conv.add_argument("--optimizer-name", default=None, metavar="NAME",
                      help="which optimizer, when the model has several")
    conv.add_argument("--dtype", default=None, metavar="DTYPE",
                      help="cast floating-point weights: bf16, fp16 or fp32 (optimizer state "
                           "keeps its dtype)")
    conv.add_argument("--hf", default=None, metavar="CONFIG_DIR",
                      help="write OUT as a folder transformers' from_pretrained loads: the "
                           "config (and tokenizer) files of CONFIG_DIR plus model.safetensors")
    conv.add_argument("--strip-prefix", default=None, metavar="PREFIX",
                      help="remove PREFIX from every parameter name (a wrapper module's "
                           "attribute, e.g. 'model.')")
    ver = sub.add_parser("verify", help="check manifests and checksums; exit code 0 or 1")
    _reader_arguments(ver)


def _reader_arguments(parser: argparse.ArgumentParser) -> None:
    """What ``inspect`` and ``verify`` both take."""
    parser.add_argument("dir", metavar="DIR", help=_DIR)
    parser.add_argument("--step", type=int, default=None, metavar="N", help="only step N")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")


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


def _inspect(args: argparse.Namespace) -> int:
    from splitsync.ckpt.offline.inspect import summarize

    report = summarize(args.dir, args.step, args.quick)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(f"{report['path']}" + (f"  (latest: {report['latest']})" if report["latest"] else ""))
        for s in report["steps"]:
            print("\n".join(_render_step(s)))
    return 0


def _verify(args: argparse.Namespace) -> int:
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


def _convert(args: argparse.Namespace) -> int:
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


def main(args: argparse.Namespace) -> int:
    """Dispatch to the action; a bad checkpoint or argument is one line on stderr, exit 1."""
    from splitsync.errors import CheckpointError

    action = {"inspect": _inspect, "verify": _verify, "convert": _convert}[args.action]
    try:
        return action(args)
    except (CheckpointError, ValueError) as e:
        print(f"splitsync ckpt {args.action}: error: {e}", file=sys.stderr)
        return 1
