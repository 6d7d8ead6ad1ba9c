"""Tensor parallelism on a small transformer: TP inside a group of ranks, FSDP2 across groups.

    splitsync run -n 4 examples/tp_transformer.py --tp 2     # 2 replicas x TP 2
    splitsync run -n 4 examples/tp_transformer.py --tp 4     # one replica, TP 4
    python examples/tp_transformer.py --tp 1                 # one process

The mesh is ``{"dp_shard": -1, "tp": T}``: ``tp`` ranks split every attention and MLP
layer (query, key, value and up projections by columns, output and down projections by
rows); the data-parallel replicas (-1: the rest of the processes) read different batches
and shard the weights with FSDP2. A checkpoint written at one layout resumes at any other
(``--resume DIR``). See docs/tensor-parallel.md.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import Dataset

import splitsync as ss


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads, not `heads`: under TP each rank holds heads / tp of them
        q, k, v = (f(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.layers = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def tp_plan() -> dict[str, object]:
    """Megatron's split: column-parallel in, row-parallel out (one all-reduce per pair)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"layers.*.attn.q": ColwiseParallel(), "layers.*.attn.k": ColwiseParallel(),
            "layers.*.attn.v": ColwiseParallel(), "layers.*.attn.o": RowwiseParallel(),
            "layers.*.up": ColwiseParallel(), "layers.*.down": RowwiseParallel()}


class Copy(Dataset):
    """Sequences whose second half repeats the first: learnable by attention alone."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        half = torch.randint(0, vocab, (n, seq // 2 + 1), generator=g)
        self.data = torch.cat([half, half[:, 1:]], dim=1)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16, help="sequences per step, in all")
    p.add_argument("--resume", default=None, help="checkpoint directory (saved every 20 steps)")
    args = p.parse_args()
    seq, vocab = 32, 64
    with ss.init(seed=0, mesh={"dp_replicate": 1, "dp_shard": -1, "tp": args.tp}) as run:
        run.print(f"{run.world_size} process(es): dp {run.dp_size} x tp {run.tp_size}")
        model = run.model(Transformer(vocab, 64, 4, 2, seq), tp_plan=tp_plan())
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        # per replica: the ranks of a TP group read the same batch
        loader = run.loader(Copy(4096, seq, vocab), args.batch // run.dp_size, shuffle=True)
        step = run.resume(args.resume, model=model, optimizer=opt).step if args.resume else 0
        run.print(f"starting at step {step}")
        for _ in run.epochs(1):
            for tokens in loader:
                if step >= args.steps:
                    break
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.flatten(0, 1),
                                                   tokens[:, 1:].flatten())
                run.backward(loss)
                run.step(opt, clip=1.0)
                step += 1
                if step % 20 == 0:
                    run.log(step=step, loss=loss)
                    if args.resume:
                        run.save(args.resume)
        run.print(f"final loss: {loss.item():.3f}")


if __name__ == "__main__":
    main()
