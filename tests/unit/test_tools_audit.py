"""The sample ledger's format and the audit's judgement, on ledgers written by hand."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from splitsync import cli
from splitsync.tools.audit.audit import audit
from splitsync.tools.audit.ledger.format import (
    MAGIC,
    json_record,
    parse,
    rank_file,
    read_file,
    step_record,
    steps_record,
)

SHIFT = 40


@pytest.mark.parametrize("ids,width", [
    (np.random.default_rng(0).permutation(60000)[:32], 2),
    (np.random.default_rng(0).permutation(60000)[:32] + 100000, 4),
    (np.array([1 << 35, 5, 1 << 36]), 8),
    ((3 << SHIFT) + np.arange(7, 39), None),  # a stream batch: one run
    (np.r_[(3 << SHIFT) + np.arange(30, 32), (5 << SHIFT) + np.arange(0, 30)], None),
    (np.empty(0, np.int64), None),
])
def test_step_records_round_trip_in_the_smallest_encoding(ids: np.ndarray, width: int | None,
                                                          tmp_path: Path) -> None:
    ids = ids.astype(np.int64)
    rec = step_record(7, 1, 2, 0, ids)
    body = len(rec) - 9 - 11 - 16  # record header, steps header, one table row
    if width is not None:
        assert body == width * len(ids)
    else:  # runs: 12 bytes each
        runs = 1 + int(np.count_nonzero(np.diff(ids) != 1)) if len(ids) else 0
        assert body == 12 * runs
    f = parse(MAGIC + json_record(b"M", {"rank": 0, "world_size": 1}) + rec, tmp_path)
    assert f.error is None
    (kind, step), = f.records
    assert kind == "S" and (step.step, step.loader, step.epoch) == (7, 1, 2)
    assert np.array_equal(step.ids, ids)


def test_many_steps_share_one_record_and_one_encoding(tmp_path: Path) -> None:
    head = MAGIC + json_record(b"M", {"rank": 0, "world_size": 1})
    rng = np.random.default_rng(1)
    # 256 steps of 32 shuffled indices, the last step of an epoch padded by one
    rows = [(s, s // 128, 32, int(s == 127)) for s in range(1, 257)]
    ids = rng.integers(0, 60000, 256 * 32)
    rec = steps_record(3, rows, ids)
    assert len(rec) == 9 + 11 + 256 * 16 + 256 * 32 * 2  # 2.5 bytes a sample
    steps = [r for _, r in parse(head + rec, tmp_path).records]
    assert [(s.step, s.epoch, s.padded, s.loader) for s in steps] == [
        (s, e, p, 3) for s, e, _, p in rows]
    assert np.array_equal(np.concatenate([s.ids for s in steps]), ids)
    # a stream's consecutive positions run on across steps: one run for 4 steps
    rec = steps_record(0, [(s, 0, 8, 0) for s in (1, 2, 3, 4)], (2 << SHIFT) + np.arange(32))
    assert len(rec) == 9 + 11 + 4 * 16 + 12
    steps = [r for _, r in parse(head + rec, tmp_path).records]
    assert [s.ids.tolist() for s in steps] == [
        ((2 << SHIFT) + np.arange(8 * k, 8 * k + 8)).tolist() for k in range(4)]
    with pytest.raises(ValueError, match="count 8 sample"):
        steps_record(0, [(1, 0, 8, 0)], np.arange(7))
    with pytest.raises(ValueError, match="negative"):
        step_record(1, 0, 0, 0, [3, -1])
    old = parse(b"SPLITSYNC-LEDGER 1\n" + head[len(MAGIC):], tmp_path)
    assert old.error is not None and "ledger format 1" in old.error


def test_a_cut_or_altered_file_is_unreadable_from_that_byte(tmp_path: Path) -> None:
    head = MAGIC + json_record(b"M", {"rank": 0, "world_size": 1})
    recs = [step_record(s, 0, 0, 0, np.arange(4 * s, 4 * s + 4) * 7) for s in (1, 2, 3)]
    data = head + b"".join(recs)
    whole = parse(data, tmp_path)
    assert whole.error is None and len(whole.records) == 3
    bounds = {len(head) + sum(map(len, recs[:k])) for k in range(4)}
    for cut in range(1, len(data)):
        f = parse(data[:cut], tmp_path)
        if cut in bounds:
            assert f.error is None  # a whole-record prefix: caught across ranks (below)
        else:
            assert f.error is not None and ("truncated" in f.error or "no launch" in f.error)
    bad = bytearray(data)
    bad[len(head) + 30] ^= 0xFF
    f = parse(bytes(bad), tmp_path)
    assert f.error is not None and "checksum" in f.error and len(f.records) == 0


# --- hand-written ledgers ----------------------------------------------------------------
def _pass(loader: int = 0, n: int = 8, bs: int = 2, world: int = 2, seed: int = 0,
          kind: str = "map", drop_last: bool = False, epoch: int = 0, shuffle: bool = True,
          start: int = 0, step: int = 0) -> dict[str, Any]:
    return {"loader": loader, "kind": kind, "seed": seed, "batch_size": bs, "shuffle": shuffle,
            "n": n, "order": "bijection", "world_size": world, "drop_last": drop_last,
            "epoch": epoch, "start": start, "step": step}


def write(run_dir: Path, launch: int, rank: int, world: int, records: list[bytes]) -> Path:
    path = rank_file(run_dir / "ledger", launch, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"launch": launch, "rank": rank, "world_size": world, "restart_count": 0,
            "seed": 0}
    path.write_bytes(MAGIC + json_record(b"M", meta) + b"".join(records))
    return path


def P(**kw: Any) -> bytes:  # noqa: N802
    return json_record(b"P", _pass(**kw))


def R(step: int, resumed: bool = True) -> bytes:  # noqa: N802
    return json_record(b"R", {"step": step, "epoch": 0, "resumed": resumed, "path": None,
                              "world_size": 2})


def C(loader: int = 0, epoch: int = 0, finished: bool = True) -> bytes:  # noqa: N802
    return json_record(b"C", {"clean": True, "step": 0, "passes": [
        {"loader": loader, "epoch": epoch, "finished": finished, "untrained": 0}]})


def S(step: int, ids: list[int], epoch: int = 0, padded: int = 0, loader: int = 0) -> bytes:  # noqa: N802
    return step_record(step, loader, epoch, padded, np.array(ids, dtype=np.int64))


def cli_audit(run_dir: Path) -> tuple[int, dict[str, Any], str]:
    outs = []
    for extra in (["--json"], []):
        buf = io.StringIO()
        with redirect_stdout(buf):
            outs.append((cli.main(["audit", str(run_dir), *extra]), buf.getvalue()))
    assert outs[0][0] == outs[1][0]
    return outs[0][0], json.loads(outs[0][1]), outs[1][1]


def test_rolled_back_steps_are_superseded_across_world_sizes(tmp_path: Path) -> None:
    # launch 1 (2 ranks): steps 1-3, checkpoint at 2, killed; launch 2 (1 rank) resumes at 2
    write(tmp_path, 1, 0, 2, [R(0, False), P(n=12), S(1, [0, 1]), S(2, [4, 5]), S(3, [8, 9])])
    write(tmp_path, 1, 1, 2, [R(0, False), P(n=12), S(1, [2, 3]), S(2, [6, 7]), S(3, [10, 0])])
    write(tmp_path, 2, 0, 1, [R(2), P(n=12, world=1), S(3, [11, 9]), S(4, [8, 10]), C()])
    rc, rep, text = cli_audit(tmp_path)
    assert rc == 0, text
    assert rep["epochs"][0] == {"loader": 0, "kind": "map", "epoch": 0, "samples": 12,
                                "once": 12, "more": 0, "never": 0, "padded": 0,
                                     "status": "exactly once"}
    assert rep["superseded"] == [{"launch": 1, "first_step": 3, "last_step": 3}]
    assert "exactly once" in text and "OK" in text


def test_a_step_one_rank_lacks_is_reported_as_lost(tmp_path: Path) -> None:
    # rank 1's file ends on a record boundary before step 2: readable, but not whole
    write(tmp_path, 1, 0, 2, [R(0, False), P(), S(1, [0, 1]), S(2, [4, 5])])
    write(tmp_path, 1, 1, 2, [R(0, False), P(), S(1, [2, 3])])
    rc, rep, text = cli_audit(tmp_path)
    assert rc == 1
    assert any("rank 1 has no record of 1 step(s)" in f["message"] and f["error"]
               for f in rep["findings"]), text


def test_padding_is_counted_apart_and_drop_last_is_allowed(tmp_path: Path) -> None:
    def run(name: str, rank0: list[int], rank1: list[int], padded: int = 0, bs: int = 3,
            drop_last: bool = False) -> tuple[int, dict[str, Any]]:
        p = P(n=5, bs=bs, drop_last=drop_last, shuffle=False)  # padding repeats index 0
        write(tmp_path / name, 1, 0, 2, [R(0, False), p, S(1, rank0), C()])
        write(tmp_path / name, 1, 1, 2, [R(0, False), p, S(1, rank1, padded=padded)])
        rc, rep, _ = cli_audit(tmp_path / name)
        return rc, rep

    # 5 samples on 2 ranks, batch 3: rank 1's last sample repeats index 0 (padding)
    rc, rep = run("pad", [0, 1, 2], [3, 4, 0], padded=1)
    e = rep["epochs"][0]
    assert rc == 0 and (e["once"], e["padded"], e["status"]) == (5, 1, "exactly once")
    rc, rep = run("dup", [0, 1, 2], [3, 2, 0], padded=1)  # 2 on both ranks: not padding
    assert rc == 1 and rep["first_bad"]["sample"] == 2 and rep["first_bad"]["rank"] == 1
    rc, rep = run("gap", [0, 1], [2, 0], padded=1, bs=2)
    e = rep["epochs"][0]
    assert rc == 1 and (e["once"], e["never"], e["status"]) == (3, 2, "gaps")
    rc, rep = run("drop", [3, 0], [1, 2], bs=2, drop_last=True)
    assert rc == 0 and rep["epochs"][0]["status"] == "dropped by drop_last"


def test_a_gap_names_the_rolled_back_step_that_held_the_sample(tmp_path: Path) -> None:
    # launch 2 resumes at step 1 but its loader skips samples 2, 3 (trained in rolled-back step 2)
    write(tmp_path, 1, 0, 1, [R(0, False), P(n=6, world=1), S(1, [0, 1]), S(2, [2, 3])])
    write(tmp_path, 2, 0, 1, [R(1), P(n=6, world=1), S(2, [4, 5]), C()])
    rc, rep, text = cli_audit(tmp_path)
    assert rc == 1
    bad = rep["first_bad"]
    assert (bad["sample"], bad["step"], bad["rank"], bad["launch"]) == (2, 2, 0, 1)
    assert bad["problem"] == "trained only in a step a crash rolled back"
    assert "index 2: trained only in a step a crash rolled back at step 2, rank 0, launch 1" \
        in text


def test_unfinished_last_epoch_is_in_progress_and_earlier_gaps_fail(tmp_path: Path) -> None:
    write(tmp_path, 1, 0, 1, [R(0, False), P(n=4, world=1), S(1, [0, 1]), S(2, [3, 2]),
                              P(n=4, world=1, epoch=1), S(3, [1, 0], epoch=1)])
    rc, rep, _ = cli_audit(tmp_path)
    assert rc == 0 and [e["status"] for e in rep["epochs"]] == ["exactly once", "in progress"]
    write(tmp_path, 1, 0, 1, [R(0, False), P(n=4, world=1), S(1, [0, 1]),
                              P(n=4, world=1, epoch=1), S(3, [1, 0], epoch=1)])
    rc, rep, _ = cli_audit(tmp_path)
    assert rc == 1 and rep["epochs"][0]["status"] == "gaps" and rep["epochs"][0]["never"] == 2


def test_stream_positions_and_resume_changes(tmp_path: Path) -> None:
    s0, s1 = 0 << SHIFT, 1 << SHIFT
    write(tmp_path / "hole", 1, 0, 1, [R(0, False), P(kind="stream", world=1),
                                       S(1, [s0, s0 + 1, s1]), S(2, [s0 + 3, s1 + 1]),
                                       P(kind="stream", world=1, epoch=1),
                                       S(3, [s0], epoch=1)])
    rc, rep, text = cli_audit(tmp_path / "hole")
    assert rc == 1 and rep["first_bad"]["name"] == "shard 0 position 2", text
    assert rep["epochs"][0]["samples"] == 6 and rep["epochs"][0]["never"] == 1

    write(tmp_path / "bs", 1, 0, 1, [R(0, False), P(n=8, world=1), S(1, [0, 1])])
    write(tmp_path / "bs", 2, 0, 1, [R(1), P(n=8, bs=3, world=1), S(2, [2, 3, 4])])
    rc, rep, text = cli_audit(tmp_path / "bs")
    assert rc == 1 and "with batch size 3 where launch 1 had 2" in text

    # a resumed loader that skips ahead of what the committed steps trained
    write(tmp_path / "ahead", 1, 0, 1, [R(0, False), P(n=8, world=1), S(1, [0, 1])])
    write(tmp_path / "ahead", 2, 0, 1, [R(1), json_record(b"P", {**_pass(n=8, world=1),
                                                                  "start": 4, "step": 1}),
                                        S(2, [4, 5])])
    rc, rep, text = cli_audit(tmp_path / "ahead")
    assert rc == 1 and "began that epoch at position 4: the data position was ahead" in text

    write(tmp_path / "nores", 1, 0, 1, [R(0, False), P(n=8, world=1), S(1, [0, 1])])
    write(tmp_path / "nores", 2, 0, 1, [P(n=8, world=1), S(1, [2, 3])])
    rc, rep, text = cli_audit(tmp_path / "nores")
    assert rc == 1 and "launch 2 trained without run.resume" in text


def test_audit_without_a_ledger_says_how_to_make_one(tmp_path: Path) -> None:
    rc, rep, _ = cli_audit(tmp_path)
    assert rc == 2 and "init(ledger=True" in rep["error"]
    with pytest.raises(FileNotFoundError, match="no sample ledger"):
        audit(tmp_path)
    write(tmp_path, 1, 0, 1, [R(0, False)])
    assert read_file(rank_file(tmp_path / "ledger", 1, 0)).error is None


def test_a_resume_that_pads_with_the_wrong_sample_fails(tmp_path: Path) -> None:
    """5 samples, 2 ranks, batch 1, killed after step 1 and resumed at position 2: rank 1's
    last position (5) is padding and repeats the epoch's position 0, index 0. A resume that
    wrapped within what remained (as resumed passes once did) repeated index 2 instead: the same
    count of padding, so counting alone called it exactly once."""
    def run(name: str, pad: int) -> tuple[int, dict[str, Any], str]:
        first = P(n=5, bs=1, shuffle=False)
        resumed = P(n=5, bs=1, shuffle=False, start=2, step=1)
        write(tmp_path / name, 1, 0, 2, [R(0, False), first, S(1, [0]), S(2, [2])])
        write(tmp_path / name, 1, 1, 2, [R(0, False), first, S(1, [1]), S(2, [3])])
        write(tmp_path / name, 2, 0, 2, [R(1), resumed, S(2, [2]), S(3, [4]), C()])
        write(tmp_path / name, 2, 1, 2, [R(1), resumed, S(2, [3]), S(3, [pad], padded=1)])
        return cli_audit(tmp_path / name)

    rc, rep, text = run("right", 0)
    assert rc == 0, text
    assert rep["epochs"][0]["padded"] == 1 and rep["epochs"][0]["status"] == "exactly once"
    rc, rep, text = run("wrong", 2)
    assert rc == 1 and rep["epochs"][0]["status"] == "wrong padding"
    bad = rep["first_bad"]
    assert (bad["sample"], bad["step"], bad["rank"], bad["launch"]) == (2, 3, 1, 2)
    assert "index 2: used as padding where DistributedSampler pads with index 0 (the pass " \
        "began at position 2 of 5 on 2 ranks) at step 3, rank 1, launch 2" in text, text
    assert "FAILED" in text


def test_padding_follows_the_sampler_at_any_size() -> None:
    """The audit's own padding (recomputed from the pass record) is what the sampler hands
    out, shuffled, for sizes and world sizes that leave padding, from any start."""
    import torch
    from torch.utils.data import TensorDataset

    from splitsync.data.loader import ShardSampler
    from splitsync.tools.audit.padding import expected_padding

    for n, world, start in ((257, 2, 40), (250, 3, 0), (253, 3, 99), (7, 4, 1), (3, 4, 2)):
        data = TensorDataset(torch.arange(float(n)))
        for rank in range(world):
            s = ShardSampler(data, world, rank, True, 9, order="bijection")
            s.resume_at(4, start)
            got = list(s)
            info = {"n": n, "start": start, "world_size": world, "seed": 9, "epoch": 4,
                    "shuffle": True, "order": "bijection"}
            assert got[len(got) - s.padding:] == expected_padding(info, rank), (n, world)
