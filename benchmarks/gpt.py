"""A GPT-2-small-class model and its training FLOPs, for the tokens/s and MFU benchmark.

FLOPs per token of one training step (forward + backward), as in the PaLM paper's
appendix: 6·N for the weight matmuls (N = parameters without the position embedding;
the token embedding counts because it is also the tied output layer) plus 12·L·d·T for
attention scores and values (L layers, width d, context T).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "GPT", "SIZES", "matmul_params", "flops_per_token", "train_mfu"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


SIZES = {
    "124m": GPTConfig(),
    "tiny": GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=64),
}


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.out = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Decoder-only transformer, pre-norm, no biases, tied input/output embedding."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=False)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual outputs
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def matmul_params(model: GPT) -> int:
    """Parameters that take part in a matmul per token: all but the position embedding."""
    return sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()


def flops_per_token(cfg: GPTConfig, n_params: int, seq_len: int | None = None) -> float:
    """Training FLOPs per token: 6·N + 12·L·d·T."""
    t = cfg.block_size if seq_len is None else seq_len
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * t


def train_mfu(size: str = "124m", *, steps: int = 20, warmup: int = 5, batch: int = 16,
              compile: bool = False, precision: str = "bf16-mixed",
              device: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Train ``steps`` steps on random tokens through splitsync; tokens/s and MFU of this rank."""
    import splitsync
    from splitsync.output.throughput import Throughput

    cfg = SIZES[size]
    with splitsync.init(seed=seed, precision=precision, device=device) as run:
        model = GPT(cfg)
        n = matmul_params(model)
        wrapped = run.model(model, compile=True) if compile else run.model(model)
        fused = run.device.type == "cuda"
        opt = torch.optim.AdamW(wrapped.parameters(), lr=3e-4, weight_decay=0.1, fused=fused)
        t = cfg.block_size
        fpt = flops_per_token(cfg, n, t)
        tp = Throughput(flops_per_sample=fpt * t, tokens_per_sample=t, device=run.device)
        sync = torch.cuda.synchronize if run.device.type == "cuda" else (lambda: None)
        g = torch.Generator(device=run.device).manual_seed(seed)
        x = torch.randint(cfg.vocab_size, (batch, t + 1), device=run.device, generator=g)
        t0 = time.perf_counter()
        for i in range(warmup + steps):
            if i == warmup:
                sync()
                compile_s = time.perf_counter() - t0
                tp.start()
            loss = wrapped(x[:, :-1], x[:, 1:])
            run.backward(loss)
            run.step(opt)
            sync()
            tp.step(samples=batch)
        stats = tp.compute()
        return {"size": size, "config": asdict(cfg), "params": sum(p.numel() for p in model.parameters()),
                "matmul_params": n, "flops_per_token": fpt, "batch": batch, "seq_len": t,
                "precision": precision, "compile": compile, "device": str(run.device),
                "device_name": torch.cuda.get_device_name(run.device)
                if run.device.type == "cuda" else "cpu",
                "peak_flops": tp.peak_flops, "steps": steps, "warmup_s": compile_s,
                "loss": float(loss.detach()), "tokens_per_s": stats.tokens_per_s,
                "tflops_per_s": stats.flops_per_s / 1e12 if stats.flops_per_s else None,
                "mfu": stats.mfu}
