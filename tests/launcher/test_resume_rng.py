"""Exact resume of every global generator: a resumed run starts its first step with Python's
``random``, NumPy's and torch's generators (CUDA's too, where present) bit-identical to the
run never stopped, though a module imported on first use draws between ``run.resume`` and
that step, with ``run.progress``, trackers and ``run.print`` in the loop; at 1 and 2
processes, in fresh processes (a lazy import happens once per process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launchkit import launch

SCRIPT = Path(__file__).with_name("rng_script.py")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _digests(out: Path, nproc: int) -> list[dict[str, str]]:
    return [json.loads(Path(f"{out}-rank{r}.json").read_text()) for r in range(nproc)]


# one process in the suite (each rank restores its own generators the same way; bit-exact
# resumes at 2 ranks stay in test_preempt_ranks.py and test_ckpt_resume.py); 2: extended
@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.extended)])
def test_every_global_generator_is_as_uninterrupted_at_the_first_step_after_a_resume(
        tmp_path: Path, nproc: int) -> None:
    steps, stop = 9, 4  # 24 samples, batch 2: 12 (1 rank) or 6 (2 ranks) steps an epoch
    launch(SCRIPT, nproc, str(tmp_path / "clean"), str(tmp_path / "clean"), "--steps",
           str(steps), timeout=200)
    ck = str(tmp_path / "ck")
    launch(SCRIPT, nproc, ck, str(tmp_path / "first"), "--steps", str(steps), "--stop-after",
           str(stop), timeout=200)
    launch(SCRIPT, nproc, ck, str(tmp_path / "second"), "--steps", str(steps), timeout=200)
    for rank, (clean, first, second) in enumerate(zip(
            _digests(tmp_path / "clean", nproc), _digests(tmp_path / "first", nproc),
            _digests(tmp_path / "second", nproc), strict=True)):
        assert sorted(map(int, clean)) == list(range(1, steps + 1))
        assert sorted(map(int, second)) == list(range(stop + 1, steps + 1)), rank
        for step, value in first.items():
            assert clean[step] == value, (rank, step)
        for step, value in second.items():  # the first step after the resume above all
            assert clean[step] == value, f"rank {rank}: generators differ at step {step}"
