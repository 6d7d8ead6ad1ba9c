"""verify's pure parts: the batch agreement, the per-run folder, epochs, causes."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitsync.tools.verify.agree import choose, global_batch
from splitsync.tools.verify.compare import _epochs
from splitsync.tools.verify.record import ScriptRecorder


def test_batch_is_per_process_or_a_global_batch_split_by_the_script() -> None:
    assert choose(16, 16, 2) == 32          # batch_size=16 at every world size
    assert choose(32, 16, 2) == 32          # batch_size=32 // run.world_size
    with pytest.raises(ValueError, match="--batch"):
        choose(10, 3, 3)


def test_both_runs_agree_through_the_shared_folder(tmp_path: Path) -> None:
    (tmp_path / "batch0-w1.json").write_text("32")
    assert global_batch(tmp_path, 0, 16, rank=0, world=2, nproc=2, timeout=5) == 32
    assert (tmp_path / "batch0-w2.json").read_text() == "16"


def test_a_run_that_ended_is_not_waited_for(tmp_path: Path) -> None:
    (tmp_path / "exited-2").touch()
    with pytest.raises(RuntimeError, match="2-process run ended"):
        global_batch(tmp_path, 0, 16, rank=0, world=1, nproc=2, timeout=60)


def test_paths_land_in_the_runs_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    rec = ScriptRecorder(tmp_path / "run", 0, 1, None, 2, 3, 2)
    monkeypatch.chdir(tmp_path)
    inside = rec.redirect_path(Path("ckpt"))
    assert inside == tmp_path / "run" / "files" / (tmp_path / "ckpt").relative_to("/")
    assert rec.redirect_path(tmp_path / "ckpt") == inside


def test_a_pass_that_trained_on_nothing_is_not_an_epoch() -> None:
    passes = [{"loader": 1, "shuffle": True, "epoch": 0, "trained": 0},  # the peek
              {"loader": 1, "shuffle": True, "epoch": 0, "trained": 3},
              {"loader": 1, "shuffle": True, "epoch": 1, "trained": 3}]
    assert _epochs({"used_run_loader": True, "passes": passes}).ok
    passes[2]["epoch"] = 0
    assert not _epochs({"used_run_loader": True, "passes": passes}).ok
