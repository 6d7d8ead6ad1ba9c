"""``splitsync ckpt``: inspect, convert and verify checkpoints offline, in one process."""

from __future__ import annotations

import argparse
import sys

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


def main(args: argparse.Namespace) -> int:
    """Dispatch to the action; a bad checkpoint or argument is one line on stderr, exit 1."""
    from splitsync.ckpt.offline import report
    from splitsync.errors import CheckpointError

    action = {"inspect": report.inspect_report, "verify": report.verify_report,
              "convert": report.convert_report}[args.action]
    try:
        return action(args)
    except (CheckpointError, ValueError) as e:
        print(f"splitsync ckpt {args.action}: error: {e}", file=sys.stderr)
        return 1
