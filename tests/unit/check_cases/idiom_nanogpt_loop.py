"""Idiomatic DDP with gradient accumulation in the style of nanoGPT's train.py (abridged).

Correct: accumulation skips the all-reduce with require_backward_grad_sync, output is guarded
by master_process, ranks seed differently on purpose. The checker may warn about hard-coded
CUDA/NCCL but must raise no error.
"""

import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

backend = "nccl"
gradient_accumulation_steps = 40
log_interval = 10
max_iters = 100

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
    device = "cpu"

if master_process:
    os.makedirs("out", exist_ok=True)
torch.manual_seed(1337 + seed_offset)

train_data = torch.randint(0, 50304, (100_000,))


def get_batch():
    # every rank draws its own random windows: sharding by independent sampling
    ix = torch.randint(len(train_data) - 65, (12,))
    x = torch.stack([train_data[i : i + 64] for i in ix])
    y = torch.stack([train_data[i + 1 : i + 65] for i in ix])
    return x.to(device), y.to(device)


model = torch.nn.Sequential(torch.nn.Embedding(50304, 64), torch.nn.Linear(64, 50304))
model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])

X, Y = get_batch()
iter_num = 0
while True:
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        logits = model(X)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), Y.view(-1))
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch()
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if iter_num % log_interval == 0 and master_process:
        lossf = loss.item() * gradient_accumulation_steps
        print(f"iter {iter_num}: loss {lossf:.4f}")
    iter_num += 1
    if iter_num > max_iters:
        break

if ddp:
    destroy_process_group()
