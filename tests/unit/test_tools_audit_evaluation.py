"""The audit knows evaluation: loaders marked train=False or found by the ledger are listed
apart, a sampler that repeats by design is audited against repeats=k, a rank with no batch
is a problem, and a stream epoch that ended early says what it trained."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, Sampler

import splitsync as ss
from splitsync import cli
from splitsync.tools.audit.audit import audit
from splitsync.tools.audit.ledger.format import MAGIC, json_record, rank_file, step_record


class Indexed(Dataset):
    def __init__(self, n: int = 8) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((2,), float(i))


class Twice(Sampler[int]):
    """Every index twice per epoch, as repeated augmentation does (timm's RASampler)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return 2 * self.n

    def __iter__(self) -> Iterator[int]:
        return iter([i for i in range(self.n) for _ in range(2)])


def cli_audit(run_dir: Path) -> tuple[int, dict[str, Any], str]:
    outs = []
    for extra in (["--json"], []):
        buf = io.StringIO()
        with redirect_stdout(buf):
            outs.append((cli.main(["audit", str(run_dir), *extra]), buf.getvalue()))
    return outs[0][0], json.loads(outs[0][1]), outs[1][1]


def _train(run_dir: Path, *, train: bool | None, epochs: int = 2) -> None:
    """Two epochs; after each, the model and its EMA evaluated in two passes."""
    with ss.init(seed=0, guards=False, ledger=True, run_dir=str(run_dir)) as run:
        model = run.model(nn.Linear(2, 1))
        ema = run.ema(model, decay=0.5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = run.loader(Indexed(), batch_size=2, shuffle=True)
        evaluate = run.loader(Indexed(6), batch_size=2, train=train)
        for _ in run.epochs(epochs):
            for x in loader:
                run.backward(model(x).sum())
                run.step(opt)
            with torch.no_grad():
                for net in (model, ema):
                    for x in evaluate:
                        net(x)


@pytest.mark.parametrize("train", [False, None], ids=["said", "found"])
def test_evaluation_passes_are_listed_apart_not_trained(tmp_path: Path,
                                                        train: bool | None) -> None:
    _train(tmp_path, train=train)
    rc, rep, text = cli_audit(tmp_path)
    assert rc == 0, text
    assert [(e["loader"], e["epoch"], e["status"]) for e in rep["epochs"]] == [
        (0, 0, "exactly once"), (0, 1, "exactly once")], text
    assert [(e["loader"], e["passes"]) for e in rep["evaluation"]] == [(1, 4)]
    assert ("train=False" if train is False else "never followed by a run.step") in \
        rep["evaluation"][0]["how"]
    assert "evaluation: loader 1" in text and "OK: every epoch exactly once" in text


def test_a_sampler_that_repeats_by_design_is_audited_against_repeats(tmp_path: Path) -> None:
    def run_with(run_dir: Path, **repeats: int) -> None:
        with ss.init(seed=0, guards=False, ledger=True, run_dir=str(run_dir)) as run:
            model = run.model(nn.Linear(2, 1))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = run.loader(Indexed(), batch_size=4, sampler=Twice(8), **repeats)
            for _ in run.epochs(1):
                for x in loader:
                    run.backward(model(x).sum())
                    run.step(opt)

    run_with(tmp_path / "said", repeats=2)
    rc, rep, text = cli_audit(tmp_path / "said")
    assert rc == 0, text
    e = rep["epochs"][0]
    assert (e["once"], e["more"], e["never"]) == (8, 0, 0)
    assert e["status"] == "up to 2 times (repeats=2)"
    assert "OK: no sample trained more than its epoch allows" in text
    run_with(tmp_path / "unsaid")
    rc, rep, text = cli_audit(tmp_path / "unsaid")
    assert rc == 1 and rep["epochs"][0]["status"] == "duplicates", text
    with ss.init(seed=0) as run, pytest.raises(ValueError, match="repeats=0"):
        run.loader(Indexed(), batch_size=4, repeats=0)


def test_a_rank_with_no_batch_is_said_at_once_and_fails_the_audit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="splitsync"), \
            ss.init(seed=0, guards=False, ledger=True, run_dir=str(tmp_path)) as run:
        logging.getLogger("splitsync").propagate = True  # (init keeps records to itself)
        model = run.model(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = run.loader(Indexed(2), batch_size=3, drop_last=True)
        for _ in run.epochs(1):
            for x in loader:
                run.backward(model(x).sum())
                run.step(opt)
    assert "rank 0 gets no batch: 2 sample(s) over 1 rank(s) at batch_size=3 with " \
           "drop_last=True" in caplog.text
    rc, rep, text = cli_audit(tmp_path)
    assert rc == 1, text
    assert "rank 0 had no batch of loader 0 (2 samples over 1 ranks at batch size 3, " \
           "drop_last): it trained nothing" in text
    assert "OK" not in text.splitlines()[-1]


def test_a_stream_epoch_that_ended_early_says_what_it_trained(tmp_path: Path) -> None:
    # what two ranks of a stream write when rank 0's shard ran out first (at_end="stop")
    stream = {"kind": "stream", "seed": 0, "batch_size": 2, "shuffle": False, "n_shards": 2,
              "window": 0, "world_size": 2, "workers": 0, "drop_last": False, "epoch": 0,
              "offsets": [0, 0], "loader": 0, "step": 0, "train": None, "repeats": 1,
              "ended_early": []}
    close = {"clean": True, "step": 1, "passes": [
        {"loader": 0, "epoch": 0, "finished": True, "untrained": 4, "evaluation": False}],
             "ended_early": [{"loader": 0, "epoch": 0, "untrained": 4}]}
    for rank in (0, 1):
        path = rank_file(tmp_path / "ledger", 1, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"launch": 1, "rank": rank, "world_size": 2, "restart_count": 0, "seed": 0}
        ids = torch.tensor([(rank << 40) + 0, (rank << 40) + 1]).numpy()
        path.write_bytes(MAGIC + json_record(b"M", meta) + json_record(b"P", stream)
                         + step_record(1, 0, 0, 0, ids) + json_record(b"C", close))
    rc, rep, text = cli_audit(tmp_path)
    assert rc == 0, text
    status = rep["epochs"][0]["status"]
    assert status.startswith("ended early: trained 4, 4 read and not trained"), status
    assert "OK: every epoch exactly once" not in text and "ended early" in text
    assert audit(tmp_path).ok
