"""examples/hf_causal_lm.py launched for real: FSDP, then DDP resuming its checkpoint, each
with an export that transformers loads back with from_pretrained."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from launchkit import launch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_causal_lm.py"
pytestmark = pytest.mark.slow


def _example():
    spec = importlib.util.spec_from_file_location("hf_causal_lm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _eval_loss(out: str) -> float:
    found = re.findall(r"final eval loss: (\d+\.\d+)", out)
    assert len(found) == 1, out  # rank 0 only
    return float(found[0])


def _loaded_eval_loss(folder: Path) -> float:
    import torch
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder)  # a local folder: nothing downloaded
    model.eval()
    with torch.no_grad():
        return model(**_example().eval_batch(64)).loss.item()


@pytest.mark.extended  # two launches of the HF example; tests/unit/test_ckpt_hf.py checks its export
@pytest.mark.timeout(540)  # above the two launches' 240 s each
def test_fsdp_checkpoint_resumes_under_ddp_and_both_export(tmp_path: Path) -> None:
    # Two launches cover what three did: FSDP shards and exports, then DDP resumes from
    # FSDP's sharded checkpoint (loading reshards), continues, learns and exports.
    pytest.importorskip("transformers")
    ckpt, fsdp_export, ddp_export = tmp_path / "ckpt", tmp_path / "fsdp", tmp_path / "ddp"
    first = launch(EXAMPLE, 2, "--strategy", "fsdp", "--steps", "4", "--save-every", "2",
                   "--ckpt-dir", str(ckpt), "--export-dir", str(fsdp_export), cwd=ROOT,
                   timeout=240)
    assert "2/2 GPT2Block sharded" in first and "resumed" not in first
    assert _loaded_eval_loss(fsdp_export) == pytest.approx(_eval_loss(first), abs=1e-4)
    second = launch(EXAMPLE, 2, "--strategy", "ddp", "--steps", "8", "--save-every", "2",
                    "--ckpt-dir", str(ckpt), "--export-dir", str(ddp_export), cwd=ROOT,
                    timeout=240)
    assert "0/2 GPT2Block sharded" in second
    assert "resumed at step 4" in second
    assert [int(s) for s in re.findall(r"step (\d+) \|", second)] == [6, 8]  # continued
    # it learns across the restart: on the fixed evaluation batch, not on a training batch
    # (the ragged windows' batches differ in difficulty: one has a loss of 7.6 at step 8)
    assert _eval_loss(second) < _eval_loss(first)
    assert sorted(p.name for p in ddp_export.iterdir()) == ["config.json", "model.safetensors"]
    assert _loaded_eval_loss(ddp_export) == pytest.approx(_eval_loss(second), abs=1e-4)
