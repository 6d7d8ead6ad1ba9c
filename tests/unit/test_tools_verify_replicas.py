"""verify's records under tensor parallelism: one per data-parallel replica, and the ranks
of a TP group checked to have trained the same batch and loss."""

from __future__ import annotations

import torch

from splitsync.tools.verify.script import layer_diff, replicas


def _record(rank: int, tp: int, loss: float, indices: list[int]) -> dict:
    return {"rank": rank, "tp_rank": rank % tp, "tp_size": tp,
            "steps": [{"loss": loss, "indices": indices}]}


def test_one_record_per_replica_and_groups_that_agree() -> None:
    records = [_record(0, 2, 1.0, [0, 1]), _record(1, 2, 1.0, [0, 1]),
               _record(2, 2, 2.0, [2, 3]), _record(3, 2, 2.0, [2, 3])]
    heads, rows = replicas(records)
    assert [r["rank"] for r in heads] == [0, 2]
    assert [(r.check, r.ok) for r in rows] == [("TP groups of 2 agree", True)]
    plain = [_record(0, 1, 1.0, [0]), _record(1, 1, 2.0, [1])]
    assert replicas(plain) == (plain, [])


def test_a_rank_that_trained_another_loss_fails_by_name() -> None:
    records = [_record(0, 2, 1.0, [0, 1]), _record(1, 2, 1.5, [0, 1])]
    _, (row,) = replicas(records)
    assert not row.ok and "rank 1 trained another batch or loss than rank 0" in row.detail


def test_layer_diff_names_the_layer() -> None:
    one = {"a.weight": torch.ones(3, dtype=torch.float64), "b.bias": torch.ones(2)}
    same = {k: v.clone() for k, v in one.items()}
    assert layer_diff(one, same).ok
    off = {**same, "b.bias": torch.tensor([1.0, 1.01])}
    row = layer_diff(one, off)
    assert not row.ok and row.detail.startswith("layer b differs: b.bias")
    assert not layer_diff(one, None).ok
