# ruff: noqa  (a fixture written in the idiom of a public training script, style included)
"""modded-nanogpt's idiom: a token loader told its rank reads its own slice of every batch
(`self.current_position = process_rank * B * T`), so no DistributedSampler is needed."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class DistributedDataLoader:
    def __init__(self, tokens, B, T, process_rank, num_processes):
        self.tokens, self.B, self.T = tokens, B, T
        self.process_rank, self.num_processes = process_rank, num_processes
        self.current_position = process_rank * B * T

    def next_batch(self):
        B, T = self.B, self.T
        buf = self.tokens[self.current_position: self.current_position + B * T + 1]
        self.current_position += B * T * self.num_processes
        return buf[:-1].view(B, T), buf[1:].view(B, T)


dist.init_process_group(backend="gloo")
ddp_rank = int(os.environ["RANK"])
ddp_world_size = int(os.environ["WORLD_SIZE"])
torch.manual_seed(0)
train_loader = DistributedDataLoader(torch.arange(10_000), 4, 16, ddp_rank, ddp_world_size)
model = DDP(torch.nn.Embedding(10_000, 8))
optimizer = torch.optim.AdamW(model.parameters())
for step in range(10):
    x, y = train_loader.next_batch()
    loss = model(x).float().mean()
    loss.backward()
    optimizer.step()
