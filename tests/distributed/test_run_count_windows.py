"""``run.backward(loss, count=n)`` at the accumulation window's edges: a save inside a counted
window (the docs' epoch-end ``run.save``), and the run's last window when the micro-batches
are not a multiple of ``accumulate``.

A counted window carries more than its micro-steps and gradients: this rank's items so far,
that it is counted, and the power of two its losses were multiplied by. A checkpoint that
dropped them resumed into a window that refused the next counted backward as mixed (or, had
it gone on, divided by the items of half a window).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from resumekit import Config, check_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("world", [1, 2])
def test_an_epoch_end_save_inside_a_counted_window_resumes_bit_equal(tmp_path: Path,
                                                                    world: int) -> None:
    """5 micro-batches of one sample per rank and epoch, 3 epochs, ``count=`` with every
    fourth sample holding no item: saves 1 of 2, 2 of 3 and 1 of 3 micro-steps into a
    window, and the run's last window holds 1 of 2 (and 15 micro-batches end in it)."""
    n = 5 * world
    cfgs = [Config(n=n, world=world, batch=1, accumulate=accumulate, epochs=3, count=True,
                   strategy="ddp", save_at=save_at, kill_at=save_at + 1)
            for accumulate, save_at in ((2, 5), (3, 5), (3, 10))]
    if world == 2:  # FSDP2: the window's unsharded gradients, the shards rescaled after it
        cfgs += [Config(n=31, world=2, batch=2, accumulate=3, strategy="fsdp", count=True,
                        save_at=save, kill_at=save + 2) for save in (7, 8)]
    for cfg, problems in zip(cfgs, check_all(cfgs, tmp_path), strict=True):
        assert problems == [], cfg.describe()
