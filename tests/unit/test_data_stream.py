"""Stream pieces on one process: what counts as a stream, layouts, windows, clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import IterableDataset

import splitsync as ss
from splitsync.data.build import is_stream
from splitsync.data.stream import Shards, choose_layout
from splitsync.data.stream.readers import window_shuffled
from splitsync.data.stream.sources import HFSource, IterSource


class Count(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(10))


def test_what_is_a_stream(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_text('{"x": 1}\n{"x": 2}\n')
    assert is_stream(Count()) and is_stream([str(f)]) and is_stream([f])
    assert is_stream(Shards([1, 2], open=range))
    assert not is_stream([1, 2, 3]) and not is_stream(["a.jsonl"])  # samples, not files
    assert not is_stream(torch.utils.data.TensorDataset(torch.arange(3)))


def test_layout_is_shard_level_only_when_shards_divide_evenly() -> None:
    assert choose_layout(8, 2, 2).mode == "shard"
    assert choose_layout(6, 2, 2).mode == "element"
    assert choose_layout(1, 1, 0).mode == "shard"
    assert "reads the whole stream" in choose_layout(3, 2, 0).describe("x", 2, 1)


@pytest.mark.parametrize("start", [0, 1, 3, 4, 7, 10])
def test_window_shuffle_resumes_at_any_position(start: int) -> None:
    src = IterSource(list(range(10)))
    full = list(window_shuffled(src, 0, 0, 4, seed=1, epoch=2))
    assert sorted(full) == list(range(10)) and full != list(range(10))
    assert list(window_shuffled(src, 0, start, 4, seed=1, epoch=2)) == full[start:]
    assert list(window_shuffled(src, 0, 0, 4, seed=1, epoch=3)) != full


def test_hf_stream_seeks_through_its_own_state(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    files = []
    for s in range(2):
        p = tmp_path / f"{s}.txt"
        p.write_text("".join(f"{s}-{i}\n" for i in range(5)))
        files.append(str(p))
    ds = datasets.load_dataset("text", data_files=files, split="train", streaming=True)
    src = HFSource(ds)
    assert src.n_shards == 2 and not src.skips_by_reading
    assert [r["text"] for r in src.open(1, 3)] == ["1-3", "1-4"]


def test_one_shot_iterators_and_bad_options_are_refused() -> None:
    with ss.init(seed=0) as run:
        with pytest.raises(TypeError, match="one-shot generator"):
            run.loader((i for i in range(3)), batch_size=2)
        with pytest.raises(TypeError, match="persistent_workers"):
            run.loader(Count(), batch_size=2, num_workers=1, persistent_workers=True)
        with pytest.raises(ValueError, match="at_end='never'"):
            run.loader(Count(), batch_size=2, at_end="never")
        with pytest.raises(TypeError, match="batch_size"):
            run.loader(Count())


def test_a_dataloader_over_a_stream_keeps_its_batching() -> None:
    with ss.init(seed=0) as run:
        loader = run.loader(torch.utils.data.DataLoader(Count(), batch_size=4))
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
