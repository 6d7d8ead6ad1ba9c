"""splitsync.testing.spawn: each rank gets ``env`` before anything of the caller's is imported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from splitsync.testing import spawn

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
