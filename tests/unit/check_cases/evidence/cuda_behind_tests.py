# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""CUDA used only behind `backend == "nccl"` (lingua's distributed set-up) or after an
`is_available()` early return (a GPU-only evaluation helper)."""
import os

import torch
import torch.distributed as dist


def setup(backend):
    dist.init_process_group(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


def gpu_memory_report(model):
    if not torch.cuda.is_available():
        return None
    probe = torch.zeros(1).cuda()
    return torch.cuda.max_memory_allocated(), probe
