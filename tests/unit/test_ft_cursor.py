"""The global data cursor of fault-tolerant runs: group-batches tile every epoch exactly once,
whatever the dataset size, group size and batch size; the lineage finds gaps and repeats."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitsync.ft.cursor import DataCursor, GroupBatches, lineage_problems


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), batch=st.integers(1, 9), group=st.integers(1, 4),
       shuffle=st.booleans(), epoch=st.integers(0, 3))
def test_an_epochs_group_batches_hold_every_sample_once(n: int, batch: int, group: int,
                                                        shuffle: bool, epoch: int) -> None:
    order = GroupBatches(n, batch, group, seed=7, shuffle=shuffle)
    seen: Counter[int] = Counter()
    padded = 0
    for j in range(order.per_epoch):
        k = epoch * order.per_epoch + j
        for rank in range(group):
            e, ids, pad = order.indices(k, rank)
            assert e == epoch and len(ids) == batch
            real = ids[: len(ids) - pad].tolist()
            seen.update(real)
            padded += pad
    assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}
    assert padded == order.per_epoch * order.size - n  # only the last group-batch pads


def test_drop_last_drops_the_tail_and_refuses_an_empty_epoch() -> None:
    order = GroupBatches(10, 2, 2, seed=0, shuffle=False, drop_last=True)
    assert order.per_epoch == 2
    with pytest.raises(ValueError, match="leaves no batch"):
        GroupBatches(3, 2, 2, seed=0, shuffle=False, drop_last=True)


def test_the_order_changes_with_the_epoch_and_not_with_the_rank_layout() -> None:
    a = GroupBatches(50, 5, 2, seed=3, shuffle=True)
    first = [a.indices(0, r)[1].tolist() for r in range(2)]
    assert first != [a.indices(a.per_epoch, r)[1].tolist() for r in range(2)]
    b = GroupBatches(50, 10, 1, seed=3, shuffle=True)  # one process reading both slices
    assert b.indices(0, 0)[1].tolist() == first[0] + first[1]


def test_commits_extend_runs_and_the_lineage_tiles() -> None:
    c = DataCursor()
    for step in range(1, 4):
        c.commit(step, 2, [[0, 1], [1, 1]])
    c.commit(4, 1, [[0, 1]])  # group 1 died
    c.commit(5, 2, [[0, 1], [1, 2]])  # it came back, another incarnation
    assert c.cursor == 9
    assert [r[:4] for r in c.runs] == [[1, 3, 0, 2], [4, 4, 6, 1], [5, 5, 7, 2]]
    assert lineage_problems(c.runs, c.cursor) == []
    again = DataCursor()
    again.load_state_dict(c.state_dict())
    assert again == c


def test_the_lineage_names_gaps_repeats_and_missing_steps() -> None:
    runs = [[1, 2, 0, 2, []], [3, 3, 3, 1, []]]  # step 3 begins at 3, not 4: repeated
    assert any("trained twice" in p for p in lineage_problems(runs, 4))
    runs = [[1, 2, 0, 2, []], [3, 3, 5, 1, []]]
    assert any("skipped" in p for p in lineage_problems(runs, 6))
    runs = [[1, 2, 0, 1, []], [4, 4, 2, 1, []]]
    assert any("missing or repeated" in p for p in lineage_problems(runs, 3))
    assert any("took part" in p for p in lineage_problems([[1, 1, 0, 2, [[0, 1]]]], 2))
