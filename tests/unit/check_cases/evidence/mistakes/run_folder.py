# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""yolov7's train.py idiom: every rank computes the next free run folder itself
(`runs/train/exp3` after `exp2`), and XCiT's: every rank creates the output folder after
testing that it is missing."""
import argparse
import glob
import os
from pathlib import Path

import torch.distributed as dist


def increment_path(path, exist_ok=True):
    path = Path(path)
    if (path.exists() and exist_ok) or (not path.exists()):
        return str(path)
    n = len(glob.glob(f"{path}*"))
    return f"{path}{n + 1}"


if __name__ == "__main__":
    opt = argparse.ArgumentParser().parse_args()
    dist.init_process_group(backend="gloo")
    opt.save_dir = increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok)
    output_dir = Path(opt.output_dir)
    if not os.path.exists(output_dir):
        os.mkdir(output_dir)
