# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""SparK's downstream util idiom: the print replacement prints where `local_rank == 0`, the
first process of every node."""
import builtins as __builtin__
import os

import torch.distributed as tdist


def init_distributed_environ():
    local_rank = int(os.environ["LOCAL_RANK"])
    tdist.init_process_group(backend="gloo")
    builtin_print = __builtin__.print

    def prt(msg, *args, **kwargs):
        force = kwargs.pop("force", False)
        if local_rank == 0 or force:
            builtin_print(msg, *args, **kwargs)

    __builtin__.print = prt
