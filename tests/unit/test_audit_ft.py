"""``splitsync audit`` of fault-tolerant runs, on ledgers written by the real recorder for a
scripted history: two groups, one dies after a step it committed with the other, a discarded
step is redone, the group comes back. The audit follows the lineage; a lost record, a repeat
in the lineage or a batch trained twice fail it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from splitsync import cli
from splitsync.ft.cursor import DataCursor, GroupBatches
from splitsync.ft.loader import Handed
from splitsync.tools.audit.ft import audit_ft
from splitsync.tools.audit.ledger.ft import FTLedger

N, BATCH = 23, 2  # 12 group-batches an epoch, the last padded


@dataclass
class _Session:  # what the recorder reads of a group's session
    cursor: DataCursor = field(default_factory=DataCursor)
    step: int = 0
    taking: int = 2
    incarnation: int = 1
    record_members: bool = False


@dataclass
class _Loader:  # what the recorder reads of the training loader
    session: _Session
    order: GroupBatches
    current: Handed | None = None


class Group:
    def __init__(self, run_dir: Path, group: int) -> None:
        self.session = _Session()
        self.loader = _Loader(self.session, GroupBatches(N, BATCH, 1, seed=0, shuffle=True))
        self.group, self.run_dir = group, run_dir
        self.start()

    def start(self) -> None:
        self.ledger = FTLedger(self.run_dir, 0, 1, 0, 0, self.group, 2)
        self.ledger.on_loader_iter(self.loader)

    def hand(self, k: int) -> None:
        epoch, ids, padded = self.loader.order.indices(k, 0)
        self.loader.current = Handed(k, epoch, ids, padded)
        self.ledger.on_batch(self.loader, ids.tolist())


def _history(tmp_path: Path, *, lose_record: bool = False, repeat: bool = False) -> None:
    g0, g1 = Group(tmp_path, 0), Group(tmp_path, 1)
    members = [[0, g0.session.incarnation], [1, g1.session.incarnation]]
    both = [g0, g1]
    for step in range(1, 5):  # steps 1-4 with both groups: group-batches 0-7
        for r, g in enumerate(both):
            g.session.step = step - 1
            if not (lose_record and step == 3 and r == 1):
                g.hand(g.session.cursor.cursor + r)
        for g in both:
            g.session.cursor.commit(step, 2, members)
    # step 5: group 1 dies mid-step; group 0's attempt is discarded, then redone alone
    g0.session.step = 4
    g0.hand(8)
    g1.hand(9)
    g0.hand(8)
    g0.session.cursor.commit(5, 1, [members[0]])
    for step in range(6, 9):  # group 0 alone: 9, 10, 11 (the epoch's last)
        g0.session.step = step - 1
        g0.hand(g0.session.cursor.cursor)
        g0.session.cursor.commit(step, 1, [members[0]])
    if repeat:  # a lineage that hands group-batch 11 out again
        g0.session.step = 8
        g0.hand(11)
        g0.session.cursor.runs.append([9, 9, 11, 1, [members[0]]])
        g0.session.cursor.cursor = 12
    g0.session.step = g0.session.cursor.runs[-1][1]
    g0.ledger.on_close(True)
    g1.ledger.on_close(False)


def test_the_lineage_s_batches_hold_every_sample_once(tmp_path: Path) -> None:
    _history(tmp_path)
    rep = audit_ft(tmp_path)
    assert rep.ok, rep.findings
    assert [(e.epoch, e.once, e.status) for e in rep.epochs] == [(0, N, "exactly once")]
    assert rep.epochs[0].padded == 12 * BATCH - N
    assert rep.extra["lineage"] == {"step": 8, "cursor": 12, "runs": 2}
    assert any("1 batch(es) handed out" in note for note in rep.extra["notes"])


def test_a_lost_record_and_a_repeated_group_batch_fail(tmp_path: Path) -> None:
    _history(tmp_path / "lost", lose_record=True)
    rep = audit_ft(tmp_path / "lost")
    assert not rep.ok
    assert any("group 1" in f.message and "0 of its 1" in f.message for f in rep.findings)
    _history(tmp_path / "again", repeat=True)
    rep = audit_ft(tmp_path / "again")
    assert not rep.ok
    assert any("trained twice" in f.message for f in rep.findings)
    assert rep.epochs[-1].status == "duplicates" or rep.first_bad is not None


def test_the_command_reads_a_fault_tolerant_ledger(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _history(tmp_path)
    assert cli.main(["audit", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["epochs"][0]["status"] == "exactly once"
    assert cli.main(["audit", str(tmp_path)]) == 0
    assert "fault tolerant: 2 replica group(s)" in capsys.readouterr().out
