"""Each way the ranks go out of step ends within 60 s of the mistake, naming every rank, its
state and its line in the script (tests/launcher/scripts/hang_kinds.py).

The default suite runs three kinds at 2 ranks under ``splitsync run``, one under plain
torchrun, one at 3 ranks and the in-step slow case short; every kind at 2 ranks, the whole
matrix (7 kinds x 2 and 3 ranks x both launchers), the default ``desync_after`` and the 90 s
sleep are ``extended``. Detection is set to 3 s here (``SPLITSYNC_DESYNC_AFTER``) to keep them short.
"""

from __future__ import annotations

import pytest
from hangkit import KINDS, launch_kind, rank_says, site

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STATES = "waiting|failed|running|left its loop|closing|raised|died"
LIMIT_S = 60.0


def _expected(kind: str, rank: int, last: int) -> tuple[str, ...]:
    """The lines rank ``rank`` may be named at (any one of them)."""
    if rank == last:
        return {
            "skip": (site("CLOSE"),), "break": (site("CLOSE"),), "spin": (site("SPIN"), site("SPIN-LOOP")),
            "loader": (site("NEXT"),), "raise": (site("RAISE"),),
            "shapes": (site("SHAPES"), site("EVERY-STEP")),
            "add": (site("ADD"), site("BACKWARD")),
        }[kind]
    return {
        "skip": (site("EVERY-STEP"),), "break": (site("BACKWARD"), site("EVERY-STEP")),
        "spin": (site("EVERY-STEP"),), "loader": (site("BACKWARD"),),
        "raise": (site("EVERY-STEP"),), "shapes": (site("EVERY-STEP"), site("SHAPES")),
        "add": (site("BACKWARD"), site("ADD"), site("EVERY-STEP")),
    }[kind]


def check_kind(kind: str, nproc: int, launcher: str, desync_after: float | None = 3.0) -> None:
    ended = launch_kind(kind, nproc, launcher, desync_after=desync_after)
    out = ended.output
    assert ended.returncode != 0, out
    assert "DIVERGED" in out, out
    assert ended.after_divergence <= LIMIT_S, (ended.after_divergence, out)
    last = nproc - 1
    for rank in range(nproc):
        where = _expected(kind, rank, last)
        assert any(rank_says(out, rank, STATES, w) for w in where), (rank, where, out)
    if kind == "loader":
        assert "DataLoader worker 0" in out and site("HANG-WORKER") in out, out


# the suite: the gloo abort (add), a worker's hang (loader) and a raise at 2 ranks, a skip at 3
# ranks and a hung worker under torchrun; every kind at 2 and 3 ranks under both launchers is
# the extended matrix below
SUITE_KINDS = ("add", "loader", "raise")


@pytest.mark.parametrize("kind", [k if k in SUITE_KINDS else pytest.param(k, marks=pytest.mark.extended)
                                  for k in KINDS])
def test_each_kind_at_two_ranks_under_splitsync_run(kind: str) -> None:
    check_kind(kind, 2, "splitsync")


@pytest.mark.parametrize("kind", [pytest.param("spin", marks=pytest.mark.extended), "loader"])
def test_under_torchrun_the_ranks_say_it_themselves(kind: str) -> None:
    check_kind(kind, 2, "torchrun")


def test_three_ranks_one_out_of_step() -> None:
    check_kind("skip", 3, "splitsync")


@pytest.mark.extended  # it waits the default 20 s by design
def test_default_settings_end_within_a_minute() -> None:
    """No SPLITSYNC_DESYNC_AFTER: the default (20 s) still ends well within 60 s."""
    check_kind("spin", 2, "splitsync", desync_after=None)


def test_ranks_slow_in_step_are_not_stopped() -> None:
    """Every rank sleeps longer than the detection delay between two collectives."""
    ended = launch_kind("slow", 2, "splitsync", "4", "6")
    assert ended.returncode == 0, ended.output
    assert "out of step" not in ended.output
    assert "rank 0 finished" in ended.output and "rank 1 finished" in ended.output


# under plain torchrun a rank that raises is named by its traceback: test_torchrun_raise
MATRIX = [(kind, nproc, launcher) for launcher in ("splitsync", "torchrun") for nproc in (2, 3)
          for kind in KINDS if not (launcher == "torchrun" and kind == "raise")]


@pytest.mark.extended
@pytest.mark.parametrize(("kind", "nproc", "launcher"), MATRIX)
def test_matrix(kind: str, nproc: int, launcher: str) -> None:
    check_kind(kind, nproc, launcher)


@pytest.mark.extended
@pytest.mark.parametrize("nproc", [2, 3])
def test_torchrun_raise(nproc: int) -> None:
    """Under plain torchrun the failing rank's traceback names its line; the others are
    named by their explained error or their SIGTERM stack dump."""
    ended = launch_kind("raise", nproc, "torchrun")
    out = ended.output
    assert ended.returncode != 0 and ended.after_divergence <= LIMIT_S, out
    assert f'hang_kinds.py", line {site("RAISE").split(":")[1]}' in out, out
    # the others: stopped by the agent's SIGTERM, which dumps their stacks first
    assert f'hang_kinds.py", line {site("EVERY-STEP").split(":")[1]} in main' in out, out


@pytest.mark.extended
@pytest.mark.timeout(400)
def test_ranks_slow_in_step_for_ninety_seconds_finish() -> None:
    ended = launch_kind("slow", 2, "splitsync", "4", "90", desync_after=None, timeout=300)
    assert ended.returncode == 0, ended.output
    assert "out of step" not in ended.output
