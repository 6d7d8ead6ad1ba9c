"""plan --memory on fake tensors: strategy syntax, bad input, the JSON keys, a 7B model."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from splitsync.commands import plan as plan_cmd
from splitsync.tools.plan.memory import (
    Variant,
    model_facts,
    optimizer_class,
    parse_strategies,
    plan,
)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_strategy_syntax_and_bad_names() -> None:
    got = parse_strategies("ddp, fsdp+offload,hsdp+act-ckpt,fsdp+offload+act-ckpt")
    assert [v.name for v in got] == ["ddp", "fsdp+offload", "hsdp+act-ckpt",
                                     "fsdp+offload+act-ckpt"]
    with pytest.raises(ValueError, match="'zero3'.*ddp, fsdp, hsdp"):
        parse_strategies("zero3")
    with pytest.raises(ValueError, match=r"\['ckpt'\].*offload, act-ckpt"):
        parse_strategies("fsdp+ckpt")
    with pytest.raises(ValueError, match="cannot offload; use fsdp\\+offload"):
        parse_strategies("ddp+offload")
    with pytest.raises(ValueError, match="not in torch.optim.*AdamW"):
        optimizer_class("Adamm")
    assert optimizer_class("sgd") is torch.optim.SGD


def test_sgd_state_sharding_offload_and_checkpointing() -> None:
    from memmodels import mlp

    facts = model_facts(mlp, (64,), 8, optimizer=torch.optim.SGD)  # no momentum: no state
    ddp, fsdp, off, ck = plan(facts, [Variant("ddp"), Variant("fsdp"),
                                      Variant("fsdp", offload=True),
                                      Variant("fsdp", act_ckpt=True)], [4], memory_gb=1)
    assert ddp.optimizer_bytes == 0 and ddp.params_bytes == 4 * facts.numel
    assert fsdp.params_bytes <= ddp.params_bytes / 4 * 1.01 and fsdp.shard == 4
    assert off.params_bytes == off.grads_bytes == 0 and off.host_bytes > 0
    assert ck.activations_bytes < 0.6 * fsdp.activations_bytes  # only block inputs kept
    assert all(p.fits for p in (ddp, fsdp, off, ck))


def test_cli_json_keys_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--memory", "--model", "memmodels:cnn", "--input-shape", "3,8,8",
            "--batch-size", "2", "--strategies", "ddp,hsdp", "--sizes", "2,16",
            "--gpus-per-node", "8", "--memory-gb", "1", "--json"]
    assert plan_cmd.main(_args(*argv)) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["strategy"], r["devices"]) for r in rows] == [
        ("ddp", 2), ("ddp", 16), ("hsdp", 2), ("hsdp", 16)]
    keys = {"strategy", "devices", "params_bytes", "grads_bytes", "optimizer_bytes",
            "activations_bytes", "peak_bytes"}
    assert all(keys <= r.keys() for r in rows)
    # hsdp shards within a node (8 devices) and replicates across nodes
    assert rows[2]["params_bytes"] == pytest.approx(rows[0]["params_bytes"] / 2, rel=0.05)
    assert rows[3]["params_bytes"] == pytest.approx(rows[0]["params_bytes"] / 8, rel=0.05)
    with pytest.raises(SystemExit, match="--memory needs --model"):
        plan_cmd.main(_args("--memory", "--batch-size", "2"))
    with pytest.raises(SystemExit, match="must divide 12"):
        plan_cmd.main(_args("--memory", "--model", "memmodels:cnn",
                            "--input-shape", "3,8,8", "--batch-size", "2", "--sizes", "12",
                            "--strategies", "hsdp"))


def test_a_7b_transformer_plans_on_fake_tensors() -> None:
    from gpt import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=32000, block_size=256, n_layer=34, n_head=32, n_embd=4096)
    facts = model_facts(lambda: GPT(cfg), (256,), 1, input_dtype=torch.long,
                        precision="bf16-mixed")
    assert 6.9e9 < facts.numel < 7.1e9
    (fsdp,) = plan(facts, [Variant("fsdp")], [8])
    assert fsdp.params_bytes == pytest.approx(4 * facts.numel / 8, rel=0.01)
    assert fsdp.optimizer_bytes == pytest.approx(8 * facts.numel / 8, rel=0.01)


def test_cli_says_which_choices_fit_and_honours_the_optimizer(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--memory", "--model", "memmodels:mlp", "--input-shape", "64",
            "--batch-size", "4", "--sizes", "2,4"]
    assert plan_cmd.main(_args(*base, "--strategies", "ddp,fsdp,fsdp+offload", "--json")) == 0
    rows = {(r["strategy"], r["devices"]): r for r in json.loads(capsys.readouterr().out)}
    assert all(r["fits"] is None for r in rows.values())  # no --memory-gb: no verdict
    # a budget between fsdp's peak at 4 devices and at 2: some fit, some do not
    gb = (rows["fsdp", 4]["peak_bytes"] + rows["fsdp", 2]["peak_bytes"]) / 2e9
    assert plan_cmd.main(_args(*base, "--strategies", "ddp,fsdp,fsdp+offload",
                               "--memory-gb", str(gb))) == 0
    text = capsys.readouterr().out
    fit = sorted(k for k, r in rows.items() if r["peak_bytes"] <= gb * 1e9)
    assert fit == [("fsdp", 4), ("fsdp+offload", 2), ("fsdp+offload", 4)]
    assert f"- fit in {gb:g} GB: fsdp at 4, fsdp+offload at 2, fsdp+offload at 4" in text
    assert "| ddp          | 2 |" in text and text.count("| no ") == 3
    assert plan_cmd.main(_args(*base, "--strategies", "fsdp", "--memory-gb", "1e-6")) == 0
    assert "fit in 1e-06 GB: none; add devices" in capsys.readouterr().out
    # --optimizer (default AdamW): plain SGD keeps no state
    assert plan_cmd.main(_args(*base, "--strategies", "ddp", "--optimizer", "SGD",
                               "--json")) == 0
    sgd = json.loads(capsys.readouterr().out)
    assert [r["optimizer_bytes"] for r in sgd] == [0, 0]
    adamw = rows["ddp", 2]  # two moments per element, and a step counter per parameter
    assert adamw["optimizer_bytes"] == pytest.approx(2 * adamw["params_bytes"], rel=1e-3)


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_the_console_script_imports_the_model_from_the_working_directory(tmp_path) -> None:
    """``splitsync plan --model mymodel:build`` run from the folder that holds mymodel.py,
    through the installed console script (which, unlike ``python -m``, does not put the
    working directory on the import path by itself)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from splitsync.testing import clean_env

    script = Path(sys.executable).with_name("splitsync")
    if not script.exists():
        script = Path(shutil.which("splitsync") or "splitsync")
    (tmp_path / "mymodel.py").write_text(
        "from torch import nn\n\n\ndef build():\n    return nn.Linear(16, 4)\n")
    out = subprocess.run([str(script), "plan", "--memory", "--model", "mymodel:build",
                          "--input-shape", "16", "--batch-size", "2", "--strategies", "ddp",
                          "--sizes", "2", "--json"], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows and rows[0]["params_bytes"] == (16 * 4 + 4) * 4
