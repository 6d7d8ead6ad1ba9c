# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""guided-diffusion's TrainLoop idiom: the resumed weights are loaded on rank 0 only, with a
helper that broadcasts the file over MPI: the other ranks never join the broadcast."""
import torch.distributed as dist
from torch.nn.parallel.distributed import DistributedDataParallel as DDP

import dist_util


class TrainLoop:
    def __init__(self, model, resume_checkpoint):
        self.model = model
        if resume_checkpoint:
            if dist.get_rank() == 0:
                self.model.load_state_dict(dist_util.load_state_dict(resume_checkpoint))
        self.ddp_model = DDP(self.model)
