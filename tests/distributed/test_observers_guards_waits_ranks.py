"""The long-wait check on 2 real gloo ranks: a step that completes in time sends nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitsync
from splitsync.observers.guards.attach import GuardObserver
from splitsync.observers.guards.responder import GENERATION_KEY, VERDICT_KEY, report_key
from splitsync.testing import spawn

pytestmark = pytest.mark.timeout(120)


def _steps(rank: int, world: int) -> list[bool]:
    import time

    # 5 s: no step of this loop waits that long, even on a loaded machine
    with splitsync.init(seed=0, desync_after=5) as run:
        model = run.model(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(20):
            run.backward(model(torch.ones(2, 4)).sum())
            run.step(opt)
            run.mean(torch.ones(1))
        watch = next(o for o in run.observers if isinstance(o, GuardObserver)).watch
        store = watch.store
        run.mean(torch.ones(1))  # every rank's steps are done before anyone looks
        seen = [store.check([GENERATION_KEY]), store.check([VERDICT_KEY]),
                store.check([report_key(0)]), store.check([report_key(1)])]
        run.mean(torch.ones(1))  # nobody looks again before both have looked
        if rank == 1:
            time.sleep(8)  # rank 0 waits in the barrier below past desync_after...
        run.barrier()  # ...and asks; a barrier waits for a rank still working: no stop
        run.mean(torch.ones(1))
        return [*seen, store.check([GENERATION_KEY]), store.check([VERDICT_KEY])]


def test_calls_that_end_in_time_publish_nothing() -> None:
    for seen in spawn(_steps, 2):
        assert seen[:4] == [False, False, False, False]  # 20 quick steps: nothing
        assert seen[4:] == [True, False]  # a long wait in the barrier: asked, not stopped


def _slow_in_step(rank: int, world: int) -> str:
    import time

    with splitsync.init(seed=0, desync_after=0.5) as run:
        run.mean(torch.ones(1))
        time.sleep(1.5)  # every rank: longer than desync_after, between two collectives
        return str(run.mean(torch.ones(1)).item())


def test_ranks_sleeping_in_step_are_not_stopped() -> None:
    assert spawn(_slow_in_step, 2) == ["1.0", "1.0"]
