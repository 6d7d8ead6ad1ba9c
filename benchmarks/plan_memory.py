"""plan --memory: predicted vs held bytes per rank (ddp, fsdp at 2 gloo ranks; hsdp at 4 as
2 replicas x 2 shards), and planning a 7B model.

    python benchmarks/plan_memory.py [--batch 4] [--skip-7b]

Prints a markdown table (model, strategy, quantity, predicted, held, predicted/held) and,
for a 7B-parameter GPT (34 layers, width 4096, seq 2048, bf16-mixed), the wall time and the
peak RSS of planning it in a fresh process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch
from memmodels import MODELS, sample

from splitsync.bench.harness import markdown_table
from splitsync.testing import spawn
from splitsync.tools.plan.memory import Variant, model_facts, plan

KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
SEVEN_B = """
import resource, time, torch
t = time.perf_counter()
import torch._dynamo  # what torch's fake tensors and optimizers load on first use
imported = time.perf_counter() - t
from gpt import GPT, GPTConfig
from splitsync.tools.plan.memory import model_facts, plan, parse_strategies
t = time.perf_counter()
cfg = GPTConfig(vocab_size=32000, block_size=2048, n_layer=34, n_head=32, n_embd=4096)
f = model_facts(lambda: GPT(cfg), (2048,), 1, input_dtype=torch.long, precision="bf16-mixed")
plans = plan(f, parse_strategies("ddp,fsdp,fsdp+act-ckpt,fsdp+offload"), [8, 64])
print(f"{f.numel / 1e9:.2f}B parameters planned in {time.perf_counter() - t:.1f} s "
      f"(after importing torch._dynamo: {imported:.1f} s), "
      f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
"""


def held_rank(rank: int, world: int, batch: int, strategies: tuple[str, ...]) -> dict:
    import splitsync as ss
    from splitsync.tools.plan.held import held_bytes

    out = {}
    holder = ss.init(seed=0)
    try:
        for strategy in strategies:
            for name, (factory, _, _) in MODELS.items():
                with ss.init(seed=0, strategy=strategy) as run:
                    options = {"replicate": 2} if strategy == "hsdp" else {}
                    model = run.model(factory(), **options)
                    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
                    out[strategy, name] = held_bytes(run, model, opt, sample(name, batch, rank))
    finally:
        holder.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--skip-7b", action="store_true")
    args = ap.parse_args()
    held = spawn(held_rank, 2, args.batch, ("ddp", "fsdp"), timeout=600)[0]
    held.update(spawn(held_rank, 4, args.batch, ("hsdp",), timeout=600)[0])
    rows = []
    for name, (factory, shape, dtype) in MODELS.items():
        facts = model_facts(factory, shape, args.batch, input_dtype=dtype)
        plans = [*plan(facts, [Variant("ddp"), Variant("fsdp")], [2]),
                 *plan(facts, [Variant("hsdp")], [4], per_node=2)]
        for p in plans:
            for key in KEYS:
                want, got = getattr(p, key), held[p.strategy, name][key]
                rows.append([name, f"{p.strategy} ({p.devices})", key.removesuffix("_bytes"), f"{want:,}",
                             f"{got:,}", f"{want / got:.3f}"])
    print(markdown_table(["model", "strategy (ranks)", "per rank", "predicted B", "held B",
                          "ratio"], rows))
    if not args.skip_7b:
        t = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", SEVEN_B], capture_output=True, text=True,
                             check=True)
        print(f"\n7B: {res.stdout.strip()} (process total {time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
