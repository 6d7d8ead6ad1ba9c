# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""MAE's util/misc.py idiom: the print replacement lets every rank print once the world size
exceeds 8."""
import builtins
import datetime

import torch.distributed as dist


def get_world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        force = force or (get_world_size() > 8)
        if is_master or force:
            now = datetime.datetime.now().time()
            builtin_print("[{}] ".format(now), end="")
            builtin_print(*args, **kwargs)

    builtins.print = print
