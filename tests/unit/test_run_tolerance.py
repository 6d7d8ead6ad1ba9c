"""Fault tolerance is a part the Run uses, not a second Run: one class, one signature per
verb whatever the mode, and the part's hooks match the protocol the Run calls."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import splitsync
from splitsync.ft.options import FTOptions
from splitsync.ft.part import FaultTolerance
from splitsync.run.runtime import Run
from splitsync.run.tolerance import Plain, Tolerance
from splitsync.train.precision import get_precision

SRC = Path(splitsync.__file__).resolve().parent


def _shape(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_no_class_subclasses_run() -> None:
    subclasses = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases}
                if "Run" in bases:
                    subclasses.append(f"{path.relative_to(SRC)}: {node.name}")
    assert not subclasses, subclasses


def test_every_part_has_the_protocol_s_signatures() -> None:
    """The Run calls its part through ``Tolerance``: both parts take exactly its arguments,
    so a verb cannot take one argument in one mode and not in the other."""
    hooks = [n for n, v in vars(Tolerance).items()
             if callable(v) and not n.startswith("_")]
    assert {"model", "loader", "epochs", "progress", "backward", "step", "log", "resume",
            "writes", "close"} <= set(hooks)
    for part in (Plain, FaultTolerance):
        for name in hooks:
            assert _shape(getattr(part, name)) == _shape(getattr(Tolerance, name)), \
                (part.__name__, name)
        for name in ("groups", "group", "preemptible", "session"):
            assert hasattr(part, name), (part.__name__, name)


def _ft_run(rank_in_quorum: int | None = 0) -> Run:
    """A Run under fault tolerance, without torchft's Manager (world size 1)."""
    with splitsync.init(seed=0) as plain:
        config, env, device = plain.config, plain.env, plain.device
    ft = FTOptions(group=0, groups=2, lighthouse="http://127.0.0.1:1")
    run = Run(replace(config, fault_tolerance=ft), env, device, "gloo", 0, False, None,
              precision=get_precision("32", device), strategy="single")
    run.session.rank_in_quorum = rank_in_quorum
    return run


def test_one_run_class_whatever_the_mode(tmp_path: Path) -> None:
    run = _ft_run()
    try:
        assert type(run) is Run and (run.replica_group, run.replica_groups) == (0, 2)
        assert run._preemption is None and run._arm_preemption() is None  # not armed
        with pytest.raises(NotImplementedError, match="count=.*fault_tolerance='torchft'"):
            run.backward(torch.ones((), requires_grad=True), count=3)
    finally:
        run.close()
    with splitsync.init(seed=0) as plain:
        assert (plain.replica_group, plain.replica_groups, plain.session) == (0, 1, None)


def test_save_takes_state_under_fault_tolerance(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    run = _ft_run(rank_in_quorum=0)  # the writing group
    try:
        path = run.save(tmp_path / "ck", step=1, state={"model": model, "lr": 0.5})
        assert Path(str(path)).name == "step-000001"
        assert run.load(tmp_path / "ck", {"model": model}).extra["lr"] == 0.5
    finally:
        run.close()
    run = _ft_run(rank_in_quorum=1)  # another group: nothing written
    try:
        assert run.save(tmp_path / "other", step=1, state={"model": model}) is None
        assert not (tmp_path / "other").exists()
    finally:
        run.close()


def test_log_takes_count_after_a_discarded_step_and_a_committed_one() -> None:
    run = _ft_run()
    try:
        run.session.last_committed = False  # a discarded step: the means, nothing written
        assert run.log(count=4, loss=2.0) == {"loss": 2.0, "count": 4}
        assert run._logging.metrics is None
        run.session.last_committed = True  # committed: written, numbered by committed steps
        assert run.log(count=4, loss=2.0) == {"loss": 2.0, "count": 4, "step": 0}
    finally:
        run.close()
