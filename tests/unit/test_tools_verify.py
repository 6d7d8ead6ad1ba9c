"""verify's pure parts: the batch agreement, the per-run folder, epochs, causes, pairs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from splitsync.tools.verify import agree
from splitsync.tools.verify.compare import _epochs, compare_runs, likely_cause
from splitsync.tools.verify.pair import Side, compare_pair, pair_cause
from splitsync.tools.verify.record import ScriptRecorder, settings


def test_every_launch_trains_at_the_references_global_batch() -> None:
    # per-process batch 16 at 2 processes: the 1-process run gets 32
    assert agree.per_rank(16 * 1 * 2, accumulate=1, world=1) == 32
    # accumulation derived from the world size (8 at 1, 4 at 2): the micro-batch stays 4
    assert agree.per_rank(4 * 4 * 2, accumulate=8, world=1) == 4
    # --accumulate 2 at 2 processes: half the micro-batch
    assert agree.per_rank(16 * 1 * 2, accumulate=2, world=2) == 8
    with pytest.raises(ValueError, match="--batch"):
        agree.per_rank(10, accumulate=3, world=1)


def test_launches_agree_through_the_shared_folder(tmp_path: Path) -> None:
    agree.publish(tmp_path, 0, 32)
    assert agree.read_global(tmp_path, 0, timeout=5) == 32


def test_a_reference_that_ended_is_not_waited_for(tmp_path: Path) -> None:
    (tmp_path / agree.EXITED.format(label=agree.REF)).touch()
    with pytest.raises(RuntimeError, match="reference run"):
        agree.read_global(tmp_path, 0, timeout=60)


def test_a_launch_imposes_strategy_and_accumulation_only_under_verify() -> None:
    assert settings({}, "auto", 2) == ("auto", 2)
    env = {"SPLITSYNC_VERIFY_DIR": "/x", "SPLITSYNC_VERIFY_STRATEGY": "fsdp",
           "SPLITSYNC_VERIFY_ACCUMULATE": "3"}
    assert settings(env, "auto", 2) == ("fsdp", 6)


def test_paths_land_in_the_runs_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    rec = ScriptRecorder(tmp_path / "run", 0, 1, None, 3, 2)
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


def _step(loss: float, grad: float, rows: list[str], micro: int = 1,
          opt_steps: float = 0.0, lr: float = 0.1) -> dict:
    return {"loss": loss, "grad_norm": grad, "rows": rows, "indices": [], "pass": 0,
            "micro": micro, "optimizer_steps": opt_steps, "lr": [lr]}


def _record(steps: list[dict], *, world: int = 1, first: int = 0, loader: bool = False,
            resumed: int | None = None) -> dict:
    return {"steps": steps, "passes": [], "init_hash": "h", "modules": ["Linear"],
            "used_run_loader": loader, "world_size": world, "first_step": first,
            "resumed_step": resumed, "saves": []}


def test_own_batches_at_1_and_n_processes_are_not_checkable_never_failed() -> None:
    """A nanoGPT-style script draws its own batches per rank: 1 vs N see other samples."""
    single = _record([_step(2.0, 1.0, ["a", "b", "c", "d"], micro=4)])
    multi = [_record([_step(2.1, 1.1, ["e", "f"], micro=2)], world=2),
             _record([_step(2.2, 1.2, ["g", "h"], micro=2)], world=2)]
    results = compare_runs(single, multi, 2)
    rows = {r.check: r for r in results}
    assert all(r.ok for r in results)
    assert rows["equal global batch"].checkable and "4 samples" in rows["equal global batch"].detail
    for name in ("2 ranks' batches = 1-process batch", "per-step loss", "set_epoch advanced"):
        assert not rows[name].checkable and "run.loader" in rows[name].detail
    assert likely_cause(results, single, multi, 2) is None


def test_a_script_reading_through_run_loader_is_not_told_it_does_not() -> None:
    single = _record([_step(2.0, 1.0, ["a", "b", "c", "d"])], loader=True)
    multi = [_record([_step(2.0, 1.0, ["a", "x"])], world=2, loader=True),
             _record([_step(2.0, 1.0, ["c", "d"])], world=2, loader=True)]
    results = compare_runs(single, multi, 2)
    cause = likely_cause(results, single, multi, 2)
    assert cause is not None and "although the script reads through run.loader" in cause
    assert "not read through run.loader" not in cause


def _side(label: str, steps: list[dict], params: float | None = 1.0, **kw: object) -> Side:
    p = None if params is None else {"w": torch.full((3,), params)}
    return Side(label, [_record(steps, **kw)], p)  # type: ignore[arg-type]


def test_summed_micro_steps_are_named_from_the_ratio_and_the_micro_step_counts() -> None:
    ref = _side("as written", [_step(1.0, 0.5, ["a", "b"]), _step(0.9, 0.4, ["c", "d"])])
    acc = _side("accumulate x2", [_step(2.0, 1.0, ["a", "b"], micro=2),
                                  _step(1.8, 0.8, ["c", "d"], micro=2)], params=1.5)
    results = compare_pair(ref, acc)
    assert [r.check for r in results if not r.ok][0] == "per-step loss"
    cause = pair_cause(results, ref, acc)
    assert cause is not None and cause.startswith("The loss is summed across micro-steps")


def test_equal_runs_pass_and_bit_equality_is_exact() -> None:
    a = _side("straight", [_step(1.0, 0.5, ["a"]), _step(0.9, 0.4, ["b"])])
    b = _side("resumed", [_step(0.9, 0.4, ["b"])], first=1, resumed=1)
    assert all(r.ok for r in compare_pair(a, b, exact=True))
    c = Side("resumed", b.records, {"w": torch.full((3,), 1.0 + 1e-7)})
    rows = {r.check: r for r in compare_pair(a, c, exact=True)}
    assert not rows["final parameters"].ok and "bit-equality" in rows["final parameters"].detail
    assert {r.check: r for r in compare_pair(a, c)}["final parameters"].ok  # within tolerance


@pytest.mark.parametrize(("argv", "message"), [
    (["--strategies", "ddp,fsdpp"], "unknown strategy 'fsdpp'"),
    (["--strategies", "ddp"], "one strategy"),
    (["--accumulate", "1"], "give K of 2 or more"),
    (["--resume", "--resume-nproc", "2"], "another world size than -n 2"),
])
def test_mode_flags_are_checked_before_anything_runs(argv: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from splitsync.commands import verify

    parser = argparse.ArgumentParser()
    verify.add_arguments(parser)
    args = parser.parse_args(["-n", "2", *argv, "missing.py"])
    assert verify.main(args) == 2
    assert message in " ".join(capsys.readouterr().out.split())


def test_a_scheduler_stepped_on_micro_steps_is_named() -> None:
    # warmup over 4 calls: the accumulation run's scheduler stepped twice per step
    ref = _side("as written", [_step(1.0, 0.5, ["a", "b"], lr=0.25),
                               _step(0.9, 0.4, ["c", "d"], lr=0.5)])
    acc = _side("accumulate x2", [_step(1.0, 0.5, ["a", "b"], micro=2, lr=0.25),
                                  _step(0.9, 0.4, ["c", "d"], micro=2, lr=0.75)])
    results = compare_pair(ref, acc)
    rows = {r.check: r for r in results}
    assert not rows["per-step learning rate"].ok
    assert rows["per-step learning rate"].detail == ("first differs at step 1: as written 0.5, "
                                                     "accumulate x2 0.75")
    cause = pair_cause(results, ref, acc)
    assert cause is not None and "runs 2x too fast" in cause
    assert "if run.step(opt): sched.step()" in cause
    # after a resume, the same symptom is a scheduler the checkpoint did not hold
    straight = _side("straight", [_step(1.0, 0.5, ["a"], lr=0.2), _step(0.9, 0.4, ["b"], lr=0.1)])
    resumed = _side("resumed", [_step(0.9, 0.4, ["b"], lr=0.2)], first=1, resumed=1)
    results = compare_pair(straight, resumed, exact=True)
    cause = pair_cause(results, straight, resumed)
    assert cause is not None and "scheduler's state was not restored" in cause


def test_a_learning_rate_scaled_by_the_world_size_is_named() -> None:
    single = _record([_step(2.0, 1.0, ["a", "b", "c", "d"], lr=0.1)], loader=True)
    multi = [_record([_step(2.0, 1.0, ["a", "b"], lr=0.2)], world=2, loader=True),
             _record([_step(2.0, 1.0, ["c", "d"], lr=0.2)], world=2, loader=True)]
    results = compare_runs(single, multi, 2)
    assert not {r.check: r for r in results}["per-step learning rate"].ok
    cause = likely_cause(results, single, multi, 2)
    assert cause is not None and cause.startswith("The learning rate depends on the number")
    assert "num_processes" in cause


def test_an_unshuffled_training_loader_is_named_not_a_batch_flag() -> None:
    trained = [{"loader": 1, "shuffle": False, "epoch": 0, "trained": 2}]
    single = _record([_step(2.0, 1.0, ["a", "b"])])
    multi = [_record([_step(2.0, 1.0, ["a", "b"])], world=2),
             _record([_step(2.0, 1.0, ["c", "d"])], world=2)]
    for record in (single, *multi):
        record["passes"] = trained
    row = {r.check: r for r in compare_runs(single, multi, 2)}["equal global batch"]
    assert not row.checkable and "the training loader is not shuffled" in row.detail
    assert "--batch" not in row.detail and "shuffle=True" in row.detail
