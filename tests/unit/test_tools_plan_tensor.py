"""plan --memory --tp on fake tensors: which parameters TP shards, the rows per TP size, the
verdict on which layout fits, and bad input."""

from __future__ import annotations

import argparse
import json
import textwrap

import pytest
import torch

from splitsync.commands import plan as plan_cmd
from splitsync.tools.plan.tensor import parse_tp, tp_facts, tp_plan

MODEL = textwrap.dedent("""
    import torch
    from torch import nn
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(300, 256)
            self.up = nn.Linear(256, 1024)
            self.down = nn.Linear(1024, 256)
            self.head = nn.Linear(256, 512)

        def forward(self, x):
            h = self.emb(x)
            h = h + self.down(torch.relu(self.up(h)))
            return self.head(h)

    def build():
        return Net()

    PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel(),
            "head": ColwiseParallel(output_layouts=Replicate())}
    WRONG = {"mlp.up": ColwiseParallel()}
""")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    plan_cmd.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def mymodel(tmp_path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "tpmodel.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    return importlib.import_module("tpmodel")


def test_tp_shards_planned_layers_only(mymodel) -> None:
    one = tp_facts(mymodel.build, (16,), 2, 2, mymodel.PLAN, input_dtype=torch.long,
                   optimizer=torch.optim.SGD)
    numel = {(p.rows, p.row_numel) for p in one.params}
    assert (300, 256) in numel  # the embedding: not planned, whole
    assert (512, 256) in numel and (256, 512) in numel  # up: rows halved; down: columns
    assert (256, 256) in numel  # head: output rows halved (gathered after, still split)
    assert (512, 1) in numel and (256, 1) in numel  # up's bias halved, down's bias whole
    four = tp_facts(mymodel.build, (16,), 2, 4, mymodel.PLAN, input_dtype=torch.long)
    assert four.activations < one.activations  # the MLP's inner activations are split
    with pytest.raises(ValueError, match="'mlp.up'"):
        tp_facts(mymodel.build, (16,), 2, 2, mymodel.WRONG, input_dtype=torch.long)
    assert parse_tp("2, 4") == [2, 4]
    with pytest.raises(ValueError, match="--tp '1'"):
        parse_tp("1")


def test_rows_at_each_size_tp_divides(mymodel) -> None:
    facts = {t: tp_facts(mymodel.build, (16,), 2, t, mymodel.PLAN, input_dtype=torch.long)
             for t in (2, 4)}
    rows = tp_plan(facts, [2, 4, 6])
    assert [(r.strategy, r.devices, r.shard) for r in rows] == [
        ("tp2+fsdp", 2, 1), ("tp2+fsdp", 4, 2), ("tp2+fsdp", 6, 3), ("tp4+fsdp", 4, 1)]


def test_cli_tp_rows_and_the_layout_that_fits(mymodel, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--memory", "--model", "tpmodel:build", "--input-shape", "16",
            "--input-dtype", "long", "--batch-size", "8", "--sizes", "2,4",
            "--strategies", "ddp", "--tp", "2,4", "--tp-plan", "tpmodel:PLAN"]
    assert plan_cmd.main(_args(*base, "--json")) == 0
    rows = {(r["strategy"], r["devices"]): r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {("ddp", 2), ("ddp", 4), ("tp2+fsdp", 2), ("tp2+fsdp", 4),
                         ("tp4+fsdp", 4)}
    assert rows["tp2+fsdp", 2]["peak_bytes"] < rows["ddp", 2]["peak_bytes"]
    # a budget only TP at 2 devices and the larger layouts meet: the verdict names it
    gb = (rows["tp2+fsdp", 2]["peak_bytes"] + rows["ddp", 2]["peak_bytes"]) / 2e9
    assert plan_cmd.main(_args(*base, "--memory-gb", str(gb))) == 0
    text = capsys.readouterr().out
    assert "tp2+fsdp at 2" in text and "- fewest devices: tp2+fsdp at 2" in text
    with pytest.raises(SystemExit, match="no TP size divides"):
        plan_cmd.main(_args(*base[:-4], "--tp", "3"))
    with pytest.raises(SystemExit, match="'mlp.up'"):
        plan_cmd.main(_args(*base[:-2], "--tp-plan", "tpmodel:WRONG"))
