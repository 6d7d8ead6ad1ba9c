"""examples/clm_no_trainer.py (Hugging Face's run_clm_no_trainer.py ported) at two
processes: a run killed after a checkpoint and relaunched by the elastic agent ends
bit-equal to the same run uninterrupted (weights, every logged loss, the perplexity), and
from_pretrained loads what it exported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from launchkit import launch, launch_anew, launch_command
from safetensors.torch import load_file

from splitsync.testing import clean_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "clm_no_trainer.py"
KILLER = Path(__file__).with_name("clm_kill.py")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ARGS = ("--checkpointing_steps", "4", "--logging_steps", "2", "--max_train_steps", "10",
        "--gradient_accumulation_steps", "2", "--num_warmup_steps", "3", "--with_tracking",
        "--report_to", "jsonl")


def _records(out: Path) -> dict[int, dict]:
    """The last record logged for each step (a relaunch logs the steps after its resume)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {(r["step"], "eval_loss" in r): r for r in rows}


@pytest.mark.extended  # two launches of a transformer: the suite kills and resumes smaller runs
def test_killed_and_relaunched_ends_bit_equal_to_the_straight_run(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    straight = tmp_path / "straight"
    log = launch(EXAMPLE, 2, "--output_dir", str(straight), *ARGS, cwd=ROOT, timeout=400)
    assert "2 process(es)" in log and "resuming" not in log
    env = {**clean_env(), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc, folder = launch_anew(
        lambda d: launch_command(KILLER, 2, "4", "--output_dir", str(d / "killed"), *ARGS,
                                 max_restarts=1),
        tmp_path, env=env, timeout=400)
    killed = folder / "killed"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resuming at step 4" in proc.stdout, proc.stdout  # it really was killed

    a, b = load_file(straight / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _records(straight) == _records(killed)  # train losses, lr, eval, bit for bit
    assert json.loads((straight / "all_results.json").read_text()) == json.loads(
        (killed / "all_results.json").read_text())

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(straight, local_files_only=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in a.items())
