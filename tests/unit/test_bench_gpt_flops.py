"""FLOP arithmetic of the GPT MFU benchmark, checked against torch's FLOP counter."""

from __future__ import annotations

import pytest
import torch
from gpt import GPT, SIZES, GPTConfig, flops_per_token, matmul_params, train_mfu
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


def test_124m_config_has_gpt2_small_parameter_count() -> None:
    with torch.device("meta"):
        model = GPT(SIZES["124m"])
    total = sum(p.numel() for p in model.parameters())
    assert 123e6 < total < 126e6  # GPT-2 small: 124M (vocab padded to 50304)
    assert matmul_params(model) == total - 1024 * 768


@pytest.mark.parametrize("cfg", [SIZES["tiny"],
                                 GPTConfig(vocab_size=96, block_size=24, n_layer=3, n_head=4,
                                           n_embd=32)])
def test_flops_per_token_matches_counted_matmuls(cfg: GPTConfig) -> None:
    model = GPT(cfg)
    b, t = 2, cfg.block_size
    x = torch.randint(cfg.vocab_size, (b, t + 1))
    # The math backend writes attention as bmm, which the counter sees.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x[:, :-1], x[:, 1:]).backward()
    counted = counter.get_total_flops()
    estimate = flops_per_token(cfg, matmul_params(model), t) * b * t
    # 6N also counts the LayerNorm weights, which take part in no matmul: the only gap.
    ln_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.LayerNorm))
    assert estimate - 6 * ln_params * b * t == counted
    attention = 12 * cfg.n_layer * cfg.n_embd * t * b * t
    assert counter.get_flop_counts()["Global"][torch.ops.aten.bmm] == attention


def test_tiny_training_run_on_cpu_reports_rates() -> None:
    r = train_mfu("tiny", steps=2, warmup=1, batch=2, precision="32", device="cpu")
    assert r["device"] == "cpu" and r["mfu"] is None and r["peak_flops"] is None
    assert r["tokens_per_s"] > 0
    assert r["tflops_per_s"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 1e12)
    assert r["flops_per_token"] == 6 * r["matmul_params"] + 12 * 2 * 64 * 32
