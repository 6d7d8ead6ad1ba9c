# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""The training script of a project with a `launch(main, ...)` helper: `main` wraps the model
in DDP and never creates the group itself."""
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher import launch


def main(epochs):
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2))
    return model


if __name__ == "__main__":
    launch(main, 2, args=(1,))
