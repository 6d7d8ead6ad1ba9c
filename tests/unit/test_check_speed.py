"""What makes ``splitsync check`` fast must not change what it finds: the tree index answers as
the walks it replaces, each file is parsed once, and files read by worker processes give the
findings one process gives."""

from __future__ import annotations

import ast
import gc
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from splitsync.check import Hit, Rule, all_rules, check_paths, runner
from splitsync.check.facts import build_facts, in_order
from splitsync.check.index import _walk_scope
from splitsync.check.pool import Pool, _drive, _frame, _unframe, _Worker, portable
from splitsync.check.project import Disk
from splitsync.check.ranks import constant_in, is_rank_like, rank_in
from splitsync.check.runner import workers_for

CASES = Path(__file__).parent / "check_cases"
FIXTURES = sorted(CASES.rglob("*.py"))
_SHARED = (ast.expr_context, ast.operator, ast.boolop, ast.cmpop, ast.unaryop)


@pytest.fixture(scope="module")
def facts_of() -> dict[Path, Any]:
    return {p: build_facts(ast.parse(p.read_text()), str(p), p.read_text()) for p in FIXTURES}


def test_index_answers_as_the_walks_it_replaces(facts_of: dict[Path, Any]) -> None:
    for facts in facts_of.values():
        assert list(facts.nodes) == list(in_order(facts.tree))
        parents: dict[ast.AST, ast.AST] = {}
        stack: list[ast.AST] = [facts.tree]
        while stack:  # the walk the index replaced: a shared Load's parent is its last user
            node = stack.pop()
            children = list(ast.iter_child_nodes(node))
            parents.update((child, node) for child in children)
            stack.extend(reversed(children))
        assert facts.parents == parents
        for kind in (ast.Assign, ast.Call, ast.Name, ast.FunctionDef):
            assert list(facts.of(kind)) == [n for n in facts.nodes if type(n) is kind]
        assert list(facts.of(ast.Constant, ast.BinOp)) == [
            n for n in facts.nodes if isinstance(n, ast.Constant | ast.BinOp)]
        for node in facts.nodes:
            if not isinstance(node, _SHARED):
                assert sorted(map(id, facts.subtree(node))) == sorted(map(id, ast.walk(node)))
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.If):
                assert list(facts.walk_scope(node)) == list(_walk_scope(node))


def test_rank_questions_answer_as_a_walk_of_the_expression(facts_of: dict[Path, Any]) -> None:
    asked = 0
    for facts in facts_of.values():
        for node in facts.nodes:
            walked = list(ast.walk(node))
            assert rank_in(facts, node) == any(is_rank_like(n) for n in walked)
            assert constant_in(facts, node, "LOCAL_RANK") == any(
                isinstance(n, ast.Constant) and n.value == "LOCAL_RANK" for n in walked)
            asked += rank_in(facts, node)
    assert asked > 100  # the fixtures do mention ranks: the comparison is not vacuous
    outsider = ast.parse("seed + rank").body[0].value  # type: ignore[attr-defined]
    assert rank_in(next(iter(facts_of.values())), outsider)  # not of that tree: walked


def _helper_alone(tmp_path: Path) -> Path:
    """The fixtures, plus a file Python cannot parse and one that is not UTF-8."""
    root = tmp_path / "cases"
    shutil.copytree(CASES, root)
    (root / "broken.py").write_text("def broken(:\n    pass\n")
    (root / "latin.py").write_bytes(b"s = '\xe9'\n")
    return root


def _named(root: Path) -> list[Path]:
    # a helper named alone (its importer beside it is read as context), and every other file
    return [p for p in sorted(root.rglob("*.py")) if p.name != "main.py"]


def test_each_file_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _helper_alone(tmp_path)
    parsed: list[str] = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda source, *a, **k: parsed.append(source) or real(
        source, *a, **k))
    found, checked = check_paths([root / "evidence" / "helper_alone" / "engine.py"], jobs=1)
    assert checked == 1 and len(parsed) == 2  # engine.py and main.py, which imports it
    parsed.clear()
    check_paths(_named(root), jobs=1)
    assert len(parsed) == len(set(parsed))  # no text parsed twice


class _InProcess:
    """The pool's interface, its workers answering in this process through the same framing."""

    def __init__(self, workers: int) -> None:
        self.procs = [_Worker() for _ in range(workers)]
        self.count = workers
        self.queued: list[list[tuple[dict[str, Any], bytearray]]] = [[] for _ in self.procs]

    def send(self, worker: int, request: dict[str, Any]) -> None:
        message = _unframe(bytearray(_frame(request)))
        answer = bytearray(_frame(self.procs[worker].answer(message)))  # type: ignore[arg-type]
        self.queued[worker].append((request, answer))

    def busy(self, worker: int) -> int:
        return len(self.queued[worker])

    def answers(self) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
        came = [(w, request, _unframe(answer)) for w, queue in enumerate(self.queued)
                for request, answer in queue]
        self.queued = [[] for _ in self.procs]
        return came  # type: ignore[return-value]


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_find_what_one_process_finds(tmp_path: Path, workers: int) -> None:
    root = _helper_alone(tmp_path)
    named = _named(root)
    for rules in (all_rules(), all_rules(gated=False)):
        alone = check_paths(named, rules, jobs=1)
        files = [Path(p) for p in named]
        results = _drive(_InProcess(workers), files, rules, Disk())  # type: ignore[arg-type]
        disk = Disk()
        order = [disk.resolve(f) for f in files] + sorted(
            k for k in results if k not in {disk.resolve(f) for f in files})
        together = [f for key in dict.fromkeys(order) for f in results.get(key, [])]
        assert together == alone[0] and len(order) == alone[1]
        assert {f.code for f in alone[0]} >= {"SS000", "SS101", "SS501"}


@pytest.mark.slow
def test_worker_processes_find_what_one_process_finds(tmp_path: Path) -> None:
    named = _named(_helper_alone(tmp_path))
    assert check_paths(named, jobs=2) == check_paths(named, jobs=1)



@pytest.mark.slow
def test_a_worker_answers_then_ends_cleanly_when_its_input_closes(tmp_path: Path) -> None:
    """It ends without the interpreter's teardown, so nothing it wrote may be lost."""
    named = [str((tmp_path / "train.py").resolve())]
    Path(named[0]).write_text("print('hi')\n")
    pool = Pool(2)
    try:
        pool.send(0, {"op": "named", "named": named})
        pool.send(0, {"op": "beside", "folder": str(tmp_path.resolve())})
        answers = []
        while pool.busy(0):
            answers += [a for w, _, a in pool.answers() if w == 0]
        assert len(answers) == 2 and "importers" in answers[1]
    finally:
        pool.close()
    assert [proc.returncode for proc in pool.procs] == [0]

def test_rules_only_this_process_knows_stay_here(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def every_call(facts: Any) -> Any:
        """Flags every call."""
        for call, _ in facts.calls:
            yield Hit(call, "a call", "none")

    own = Rule("SS999", "every-call", "info", "every call", "test rule", every_call)
    assert not portable((own,)) and portable(all_rules()) and portable(all_rules(gated=False))
    assert not portable((replace(all_rules()[0], name="renamed"),))
    monkeypatch.setattr(runner, "analyse_in_pool", None)  # would fail if it were used
    found, _ = check_paths([CASES / "fixed_example1.py"], (own,), jobs=2)
    assert found and {f.code for f in found} == {"SS999"}


def test_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    assert workers_for(3) == 1 and workers_for(10_000, jobs=1) == 1
    assert workers_for(3, jobs=2) == 2
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert workers_for(10_000) == 8  # one per core
    assert workers_for(30) == 2 and workers_for(23) == 1  # a dozen files per process at least
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert workers_for(10_000) == 2
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="jobs=.*number of processes >= 1"):
            workers_for(100, jobs=bad)  # type: ignore[arg-type]


def test_the_collector_runs_again_after_a_check() -> None:
    assert gc.isenabled()
    check_paths([CASES / "fixed_example1.py"], jobs=1)
    assert gc.isenabled()


def test_jobs_flag(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from splitsync.commands import check

    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    script = str(CASES / "fixed_example1.py")
    assert check.main(parser.parse_args([script, "--jobs", "0"])) == 2
    assert "--jobs 0: give a number of processes >= 1" in capsys.readouterr().err
    assert check.main(parser.parse_args([script, "--jobs", "1", "--json"])) == 0
    assert '"files_checked": 1' in capsys.readouterr().out


def test_nodes_of_a_type_inside_a_node(facts_of: dict[Path, Any]) -> None:
    for facts in facts_of.values():
        for node in facts.of(ast.FunctionDef, ast.ClassDef, ast.If):
            for kind in (ast.Assign, ast.Return, ast.Call):
                walked = [n for n in ast.walk(node) if type(n) is kind]
                assert sorted(map(id, facts.inside(node, kind))) == sorted(map(id, walked))
