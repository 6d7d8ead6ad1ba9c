"""Hugging Face folders from run.export and ckpt convert --hf, offline, on a tiny GPT-2 with
tied embeddings: tied weights written once (as save_pretrained writes them), a config from
config.save_pretrained (which names no architecture) taken without a warning, and
from_pretrained loading the result."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import splitsync as ss
from splitsync.cli import main as cli

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes most of a minute here


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=40, n_positions=8, n_embd=8, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def _names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sorted(f.keys())


def _trained(run: ss.Run) -> torch.nn.Module:
    model = run.model(_gpt2())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ids = torch.arange(16).view(2, 8) % 40
    run.backward(model(input_ids=ids, labels=ids).loss)
    run.step(opt)
    return model


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(v, sb[k]) for k, v in sa.items())


def test_export_writes_tied_weights_once_and_from_pretrained_ties_them(tmp_path: Path) -> None:
    from transformers import GPT2LMHeadModel

    with ss.init(seed=0) as run:
        model = _trained(run)
        run.export(tmp_path / "out" / "model.safetensors")
        run.unwrap(model).config.save_pretrained(tmp_path / "out")
        run.unwrap(model).save_pretrained(tmp_path / "ref")
    ours, theirs = _names(tmp_path / "out" / "model.safetensors"), _names(
        tmp_path / "ref" / "model.safetensors")
    assert ours == theirs and "lm_head.weight" not in ours  # 28 tensors, not 29
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "out", local_files_only=True)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert _same_weights(loaded, run.unwrap(model))


def test_convert_hf_takes_a_config_that_names_no_architecture(tmp_path: Path) -> None:
    from transformers import GPT2LMHeadModel

    with ss.init(seed=0) as run:
        model = _trained(run)
        run.save(tmp_path / "ckpt")  # no run.resume: what the run wrapped
        run.unwrap(model).config.save_pretrained(tmp_path / "config")  # as the HF example
        run.unwrap(model).save_pretrained(tmp_path / "ref")
    assert json.loads((tmp_path / "config" / "config.json").read_text()).get(
        "architectures") is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli(["ckpt", "convert", str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--hf",
                    str(tmp_path / "config")])
    assert code == 0
    assert not [w for w in caught if "architecture" in str(w.message)], \
        [str(w.message) for w in caught]
    assert _names(tmp_path / "hf" / "model.safetensors") == _names(
        tmp_path / "ref" / "model.safetensors")
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert _same_weights(loaded, run.unwrap(model))
