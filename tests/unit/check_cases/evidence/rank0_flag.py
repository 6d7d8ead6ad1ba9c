# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""imagen-pytorch's Trainer idiom: a flag computed from the main-process tests guards the
checkpoint writes (`self.can_checkpoint = self.is_local_main if local else self.is_main`)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, local_fs=True):
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        self.is_main = dist.get_rank() == 0
        self.is_local_main = int(__import__("os").environ["LOCAL_RANK"]) == 0
        self.can_checkpoint = self.is_local_main if local_fs else self.is_main
        self.model = DDP(model)

    def save(self, path):
        if not self.can_checkpoint:
            return
        torch.save(self.model.module.state_dict(), path)
        print(f"checkpoint saved to {path}")


if __name__ == "__main__":
    Trainer(torch.nn.Linear(2, 2)).save("ckpt.pt")
