# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""consistency_models' TrainLoop idiom: without CUDA the model is not wrapped in DDP, with
only a warning, although the data is still sharded by rank."""
import torch as th
import torch.distributed as dist
from torch.nn.parallel.distributed import DistributedDataParallel as DDP


class TrainLoop:
    def __init__(self, model):
        self.model = model
        if th.cuda.is_available():
            self.use_ddp = True
            self.ddp_model = DDP(self.model, device_ids=[0])
        else:
            if dist.get_world_size() > 1:
                print("Distributed training requires CUDA. Gradients will not be synchronized!")
            self.use_ddp = False
            self.ddp_model = self.model
