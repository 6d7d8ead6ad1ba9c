"""run.meter on a real 2-rank gloo group: reduced over ranks on read, and a resumed epoch
covers the whole epoch (the totals saved by rank 0, the other ranks from zero)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from splitsync.testing import spawn

pytestmark = pytest.mark.timeout(200)


def meter_rank(rank: int, world: int, tmp: str) -> dict:
    import splitsync as ss

    def epoch(run, meter, model, opt, steps: range, save_at: int = -1) -> None:
        for i in steps:
            run.backward(model(torch.ones(1, 2)).sum())
            run.step(opt)
            meter.add(loss=torch.tensor(10.0 * rank + i), count=1 + rank)
            if i == save_at:
                run.save()

    holder = ss.init(seed=0)  # one process group for both runs
    try:
        with ss.init(seed=0) as run:
            model = run.model(nn.Linear(2, 1))
            meter = run.meter()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            run.resume(Path(tmp) / "ck", model=model, optimizer=opt)
            epoch(run, meter, model, opt, range(4), save_at=1)
            whole = meter.compute()
        with ss.init(seed=0) as run:
            model = run.model(nn.Linear(2, 1))
            meter = run.meter()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            run.resume(Path(tmp) / "ck", model=model, optimizer=opt)
            epoch(run, meter, model, opt, range(2, 4))
            resumed = meter.compute()
    finally:
        holder.close()
    return {"whole": whole, "resumed": resumed}


@pytest.mark.slow
def test_a_resumed_epoch_covers_the_whole_epoch_on_every_rank(tmp_path: Path) -> None:
    out = spawn(meter_rank, 2, str(tmp_path), timeout=180)
    # rank 0 adds 0..3 with weight 1, rank 1 adds 10..13 with weight 2
    expected = (sum(range(4)) + 2 * sum(range(10, 14))) / 12
    for r in out:
        assert r["whole"] == {"loss": pytest.approx(expected, rel=1e-12)}
        assert r["resumed"] == {"loss": pytest.approx(expected, rel=1e-12)}
