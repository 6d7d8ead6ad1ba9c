# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""guided-diffusion's dist_util idiom: rank 0 reads the file and broadcasts it over MPI."""
import io

import torch as th
from mpi4py import MPI


def load_state_dict(path, **kwargs):
    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(path, "rb") as f:
            data = f.read()
        MPI.COMM_WORLD.bcast(data)
    else:
        data = MPI.COMM_WORLD.bcast(None)
    return th.load(io.BytesIO(data), **kwargs)
