"""docs/strategies.md: the strategy guide's plan --memory example and predicted-vs-held table."""

from __future__ import annotations

import re
from pathlib import Path

DOC = (Path(__file__).resolve().parents[2] / "docs" / "strategies.md").read_text(encoding="utf-8")


def test_the_guide_shows_plan_memory_output() -> None:
    blocks = re.findall(r"```\n(\$ splitsync plan --memory .*?)```", DOC, flags=re.S)
    assert blocks, "no `$ splitsync plan --memory` example in docs/strategies.md"
    out = blocks[0]
    header = next(line for line in out.splitlines() if line.startswith("| strategy "))
    for column in ("params", "grads", "optimizer", "activations", "peak", "fits"):
        assert f" {column} " in header, column
    assert "- fit in " in out


def test_predicted_vs_held_table_covers_three_models_and_meets_the_tolerances() -> None:
    rows = re.findall(r"^\| (mlp|tiny-gpt|cnn) \| (\w+) \((\d)\) \|(.*)\|$", DOC, flags=re.M)
    seen = {(model, strategy, int(n)) for model, strategy, n, _ in rows}
    assert seen == {(m, s, n) for m in ("mlp", "tiny-gpt", "cnn")
                    for s, n in (("ddp", 2), ("fsdp", 2), ("hsdp", 4))}
    for model, strategy, _, cells in rows:
        pairs = [tuple(int(v.replace(",", "")) for v in c.split(" / "))
                 for c in cells.split("|")]
        assert len(pairs) == 4, (model, strategy)  # params, grads, optimizer, activations
        for (predicted, held), tol in zip(pairs, (0.05, 0.05, 0.05, 0.25), strict=True):
            assert held > 0 and abs(predicted - held) <= tol * held, (model, strategy)
