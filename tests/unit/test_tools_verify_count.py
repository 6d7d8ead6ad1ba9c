"""verify under count=: the step loss is the mean over every rank's items, and a token mean
handed to run.backward without count= is named as the likely cause."""

from __future__ import annotations

from pathlib import Path

from splitsync.tools.verify.compare import compare_runs, likely_cause, step_loss
from splitsync.tools.verify.record import _step_loss
from splitsync.tools.verify.script import token_mean_cause


def _step(loss: float, grad: float, rows: list[str], count: float | None = None) -> dict:
    return {"loss": loss, "count": count, "grad_norm": grad, "rows": rows, "indices": [],
            "pass": 0, "micro": 1, "optimizer_steps": 0.0}


def _record(steps: list[dict], world: int = 1) -> dict:
    return {"steps": steps, "passes": [], "init_hash": "h", "modules": ["Linear"],
            "used_run_loader": True, "world_size": world, "first_step": 0,
            "resumed_step": None, "saves": []}


def test_a_step_loss_weighs_each_rank_by_its_items() -> None:
    assert step_loss([{"loss": 1.0, "count": 3.0}, {"loss": 2.0, "count": 1.0}]) == 1.25
    # a rank without items adds nothing, whatever its mean over nothing is
    assert step_loss([{"loss": 1.0, "count": 3.0}, {"loss": float("nan"), "count": 0}]) == 1.0
    assert step_loss([{"loss": 1.0, "count": None}, {"loss": 2.0, "count": None}]) == 1.5


def test_the_recorder_keeps_the_mean_over_the_steps_items() -> None:
    assert _step_loss([2.0, float("nan"), 4.0], [1.0, 0.0, 3.0], 3) == (3.5, 4.0)
    assert _step_loss([2.0, 4.0], [None, None], 2) == (3.0, None)
    assert _step_loss([], [], 1) == (None, None)


def test_counted_runs_compare_their_global_means() -> None:
    single = _record([_step(1.25, 1.0, ["a", "b"], count=4.0)])
    multi = [_record([_step(1.0, 1.0, ["a"], count=3.0)], 2),
             _record([_step(2.0, 1.0, ["b"], count=1.0)], 2)]
    results = compare_runs(single, multi, 2)
    assert all(r.ok for r in results), results


def test_the_token_mean_is_the_cause_only_without_count() -> None:
    single = _record([_step(1.25, 1.0, ["a", "b"])])
    multi = [_record([_step(1.0, 1.1, ["a"])], 2), _record([_step(2.0, 1.1, ["b"])], 2)]
    results = compare_runs(single, multi, 2)
    assert not {r.check: r for r in results}["per-step loss"].ok
    assert likely_cause(results, single, multi, 2, "TOKENS") == "TOKENS"
    assert likely_cause(results, single, multi, 2) != "TOKENS"
    for r in multi:  # the run gave its counts: the token mean is not what differs
        r["steps"][0]["count"] = 1.0
    assert likely_cause(results, single, multi, 2, "TOKENS") != "TOKENS"


def test_the_cause_quotes_the_script_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import splitsync as ss\nwith ss.init() as run:\n"
                      "    for x, m in loader:\n"
                      "        loss = (lossfn(x) * m).sum() / m.sum()\n"
                      "        run.backward(loss)\n")
    cause = token_mean_cause(str(script))
    assert cause is not None and cause.startswith("train.py:5: the loss is a mean")
    assert "run.backward(loss, count=n)" in cause
    script.write_text(script.read_text().replace("run.backward(loss)",
                                                 "run.backward(loss, count=m.sum())"))
    assert token_mean_cause(str(script)) is None
