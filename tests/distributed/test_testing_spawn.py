"""splitsync.testing.spawn: each rank gets ``env`` before anything of the caller's is imported."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from splitsync.testing import SpawnError, spawn

pytestmark = pytest.mark.timeout(120)

MODULE = '''
import os
AT_IMPORT = os.environ.get("SPLITSYNC_TEST_MARK")  # read once, as fsspec reads its config

def report(rank, world):
    return AT_IMPORT, os.environ.get("SPLITSYNC_TEST_MARK")
'''


def test_fn_module_is_imported_with_the_ranks_environment(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "envmark_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SPLITSYNC_TEST_MARK", raising=False)
    import envmark_mod

    # the fork server may already run, started without the variable: it must not matter
    assert spawn(envmark_mod.report, 1) == [(None, None)]
    got = spawn(envmark_mod.report, 2, env={**dict(__import__("os").environ),
                                            "SPLITSYNC_TEST_MARK": "yes"})
    assert got == [("yes", "yes"), ("yes", "yes")]
    sys.modules.pop("envmark_mod", None)


def _stuck_in_a_named_place(rank: int, world: int) -> None:
    if rank == 1:
        time.sleep(600)  # stands for a deadlock: the error must show this line


def test_spawn_timeout_shows_the_hung_ranks_stacks() -> None:
    with pytest.raises(SpawnError) as err:
        spawn(_stuck_in_a_named_place, 2, timeout=8)
    text = str(err.value)
    assert "rank(s) [1] did not finish" in text
    assert "stacks of rank 1" in text and "stacks of rank 0" not in text
    assert "_stuck_in_a_named_place" in text  # the Python frame where it waits
