"""The lesson's examples as written, their corrected versions, and idiomatic DDP scripts."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitsync.check import all_rules, check_file

CASES = Path(__file__).parent / "check_cases"


def codes(name: str) -> set[str]:
    return {f.code for f in check_file(CASES / name)}


def test_example3_as_written_triggers_the_lessons_mistakes() -> None:
    found = check_file(CASES / "seed_example3.py", all_rules(gated=False))
    by_code = {f.code: f for f in found}
    # train never called, nccl hard-coded, no seed before the model
    assert {"SS203", "SS204", "SS401"} <= set(by_code)
    assert by_code["SS203"].severity == "error"
    # its input is torch.randn drawn unseeded on each rank: different data per rank, not
    # unsharded data
    assert "SS301" not in by_code
    assert "`train(rank, world_size)`" in by_code["SS203"].message
    assert "\"nccl\"" in by_code["SS204"].message
    assert "`SimpleNet()`" in by_code["SS401"].message
    # and CUDA is assumed: set_device without a GPU check, a modulo by device_count()
    assert "SS101" in by_code
    assert all(f.path.endswith("seed_example3.py") for f in found)


def test_example2_as_written_uses_data_parallel_and_cuda0() -> None:
    assert codes("seed_example2.py") == {"SS201", "SS101"}


def test_lesson_mistake_snippet_is_a_device_mismatch() -> None:
    assert codes("seed_mistake_devices.py") == {"SS101", "SS102"}


def test_example1_is_already_portable() -> None:
    assert codes("seed_example1.py") == set()


@pytest.mark.parametrize("name", sorted(p.name for p in CASES.glob("fixed_*.py")))
def test_corrected_versions_are_clean(name: str) -> None:
    assert check_file(CASES / name) == []


@pytest.mark.parametrize("name", sorted(p.name for p in CASES.glob("idiom_*.py")))
def test_idiomatic_gpu_only_ddp_has_no_errors(name: str) -> None:
    found = check_file(CASES / name)
    assert [f for f in found if f.severity == "error"] == []
    # only portability warnings (these scripts assume CUDA and NCCL on purpose) and, for the
    # torchrun trainer, its snapshot written under the local rank (once per machine)
    assert {f.code for f in found} <= {"SS101", "SS104", "SS204", "SS504"}
