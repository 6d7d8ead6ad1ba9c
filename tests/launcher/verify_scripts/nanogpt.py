"""A nanoGPT-style training script on splitsync (the shape of nanoGPT's train.py, tiny).

As in nanoGPT: batches are random offsets into one token stream, drawn per rank from
``run.generator(per_rank=True)`` (seeded from the run's seed and the rank, saved and restored
by run.save/run.resume); the gradient accumulation is derived from the world size (40 //
world there, 4 // world here: ``init(accumulate=...)`` takes the function), so the global
batch is the same at any process count; the step clips at 1.0; AdamW; a checkpoint every
iteration, resumed on start.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import splitsync

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", default="out")
parser.add_argument("--max-iters", type=int, default=50)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--block", type=int, default=16)
args = parser.parse_args()

VOCAB, SEED = 32, 1337
tokens = torch.randint(VOCAB, (20_000,), generator=torch.Generator().manual_seed(0))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(args.block, d)
        self.block, self.ln_f = Block(d), nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        logits = self.head(self.ln_f(self.block(x)))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


with splitsync.init(seed=SEED, accumulate=lambda world_size: 4 // world_size) as run:
    grad_accum = run.config.accumulate
    model = run.model(GPT())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    gen = run.generator(per_rank=True)
    state = run.resume(args.ckpt, model=model, optimizer=opt)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(tokens) - args.block - 1, (args.batch_size,), generator=gen)
        x = torch.stack([tokens[i:i + args.block] for i in ix])
        y = torch.stack([tokens[i + 1:i + 1 + args.block] for i in ix])
        return run.to_device((x, y))

    it = state.step
    while it < args.max_iters:
        X, Y = get_batch()
        for micro in range(grad_accum):
            loss = model(X, Y)
            if micro + 1 < grad_accum:  # prefetch, as nanoGPT does, within the step only: a
                X, Y = get_batch()  # batch drawn before run.save would be skipped on resume
            run.backward(loss)
            run.step(opt, clip=1.0)  # steps on the grad_accum-th call
        it += 1
        run.save()
        if it % 10 == 0:
            run.print(f"iter {it}: loss {loss.item():.4f}")
