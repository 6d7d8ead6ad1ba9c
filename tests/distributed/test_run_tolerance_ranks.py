"""``run.log(count=)`` under fault tolerance on 2 gloo ranks: after a discarded step and a
committed one, each rank's metric weighs by its count (0.75 here), as without fault
tolerance; averaged as an ordinary metric it would be 0.5."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import splitsync
from splitsync.ft.options import FTOptions
from splitsync.run.runtime import Run
from splitsync.testing import spawn
from splitsync.train.precision import get_precision

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _log(rank: int, world: int) -> list[dict[str, Any]]:
    with splitsync.init(seed=0) as plain:
        ft = FTOptions(group=0, groups=2, lighthouse="http://127.0.0.1:1")
        run = Run(replace(plain.config, fault_tolerance=ft), plain.env, plain.device, "gloo",
                  0, False, None, precision=get_precision("32", plain.device),
                  strategy="ddp")
        try:
            out = []
            for committed in (False, True):
                run.session.last_committed = committed
                out.append(run.log(count=1 + 2 * rank, loss=float(rank)))
        finally:
            run.close()
    return out


def test_log_weighs_by_count_under_fault_tolerance() -> None:
    for records in spawn(_log, 2, timeout=240):
        discarded, committed = records
        assert discarded == {"loss": 0.75, "count": 4}
        assert committed == {"loss": 0.75, "count": 4, "step": 0}
