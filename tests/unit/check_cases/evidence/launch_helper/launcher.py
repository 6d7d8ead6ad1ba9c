# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""A detectron2-style `launch(main_func, num_gpus, ...)` helper: it spawns the workers and
creates the process group in each before calling the main function."""
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(local_rank, main_func, world_size, args):
    dist.init_process_group("gloo", rank=local_rank, world_size=world_size)
    main_func(*args)


def launch(main_func, num_gpus, args=()):
    mp.spawn(_worker, nprocs=num_gpus, args=(main_func, num_gpus, args))
