"""A webdataset pipeline with a random stage resumes exactly, or is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

import splitsync as ss

wds = pytest.importorskip("webdataset")

SIZES = (20, 20)  # two shards; 5 batches of 3 stop in the middle of the first one


def _tars(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    files, nxt = [], 0
    for s, n in enumerate(SIZES):
        f = root / f"shard-{s}.tar"
        with wds.TarWriter(str(f)) as w:
            for i in range(nxt, nxt + n):
                w.write({"__key__": f"{i:06d}", "id": str(i)})
        nxt += n
        files.append(str(f))
    return files


def _ids(batch: list[dict[str, bytes]]) -> list[int]:
    return [int(x["id"].decode()) for x in batch]


def _train(files: list[str], ck: Path, stop: int | None, epochs: int = 1) -> list[list[int]]:
    """Epochs of a pipeline with ``.shuffle(8)`` (seeded by webdataset from pid and time);
    with ``stop``, save after that many batches and stop (a kill right after a save)."""
    pipe = wds.WebDataset(files, shardshuffle=False, empty_check=False).shuffle(8)
    seen: list[list[int]] = []
    with ss.init(seed=5, guards=False) as run:
        loader = run.loader(pipe, batch_size=3, collate_fn=_ids)
        state = run.resume(ck)
        for _ in run.epochs(epochs, start=state.epoch):
            for batch in loader:
                seen.append(batch)
                if len(seen) == stop:
                    run.save(step=len(seen))
                    return seen
    return seen


def test_shuffle_stage_resumes_mid_shard_exactly(tmp_path: Path) -> None:
    files = _tars(tmp_path / "data")
    full = _train(files, tmp_path / "full", None, epochs=2)
    again = _train(files, tmp_path / "again", None, epochs=2)
    assert again == full  # the stage draws from (seed, epoch, shard), not pid and time
    per_epoch = len(full) // 2
    assert full[:per_epoch] != full[per_epoch:]  # still a shuffle: another order each epoch
    flat = [i for b in full[:per_epoch] for i in b]
    assert flat != sorted(flat) and sorted(flat) == list(range(sum(SIZES)))
    before = _train(files, tmp_path / "ck", 5)  # 15 samples: mid-way through shard 0
    after = _train(files, tmp_path / "ck", None)
    assert before + after == full[:per_epoch]  # nothing lost, nothing repeated, same order


def test_random_stage_without_shard_list_is_refused() -> None:
    def samples():  # type: ignore[no-untyped-def]
        return iter([{"id": b"1"}] * 10)

    pipe = wds.DataPipeline(samples, wds.shuffle(16))
    with ss.init(seed=0, guards=False) as run, \
            pytest.raises(TypeError, match=r"random stage \(shuffle\(16\)\).*list of urls"):
        run.loader(pipe, batch_size=2)
