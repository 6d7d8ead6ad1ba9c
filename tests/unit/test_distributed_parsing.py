"""One parser for launcher integers and SLURM node lists, shared by ``env`` and ``launch``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from splitsync.distributed.env import detect_env
from splitsync.distributed.parsing import (
    EnvError,
    env_int,
    first_host,
    optional_int,
    slurm_nodelist,
    slurm_tasks_per_node,
)
from splitsync.launch.cluster import launch_defaults


def test_optional_int_reads_blank_as_unset_and_strips() -> None:
    assert optional_int({}, "N", "fix") is None
    assert optional_int({"N": "  "}, "N", "fix") is None
    assert optional_int({"N": " 12 "}, "N", "fix") == 12


@pytest.mark.parametrize(("raw", "word"), [("two", "not an integer"), ("1.5", "not an integer"),
                                           ("-3", "negative")])
def test_bad_integers_name_variable_text_and_fix(raw: str, word: str) -> None:
    with pytest.raises(EnvError) as info:
        optional_int({"N": raw}, "N", "Set N to a count.")
    assert f"N={raw!r}" in str(info.value) and word in str(info.value)
    assert "Set N to a count." in str(info.value)


def test_env_int_defaults_or_names_the_missing_variable() -> None:
    assert env_int({}, "N", "fix", default=0) == 0
    assert env_int({"N": "4"}, "N", "fix", default=0) == 4
    with pytest.raises(EnvError, match="N is not set. Set it."):
        env_int({}, "N", "Set it.")


def test_nodelist_order_step_then_job_then_legacy() -> None:
    assert slurm_nodelist({}) is None
    assert slurm_nodelist({"SLURM_NODELIST": "c[1-2]", "SLURM_JOB_NODELIST": "b1"}) == "b1"
    assert slurm_nodelist({"SLURM_STEP_NODELIST": "a[7,9]", "SLURM_JOB_NODELIST": "b1"}) == "a[7,9]"
    assert first_host("a[7,9]") == "a7"


def test_env_and_cluster_defaults_reject_the_same_text_in_the_same_words() -> None:
    slurm = {"SLURM_JOB_ID": "5", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
             "SLURM_JOB_NODELIST": "gpu[003-004]", "SLURM_STEP_ID": "0"}
    for bad in ("x", "-1"):
        with pytest.raises(EnvError) as from_env:
            detect_env({**slurm, "SLURM_NNODES": bad})
        with pytest.raises(EnvError) as from_cluster:
            launch_defaults({**slurm, "SLURM_NNODES": bad})
        first = str(from_env.value).split(". ")[0]
        assert first == str(from_cluster.value).split(". ")[0] == (
            f"SLURM_NNODES={bad!r} is " + ("not an integer" if bad == "x" else "negative"))
    # and both read the same first host from the same node list
    assert detect_env(slurm).master_addr == "gpu003"
    assert launch_defaults({**slurm, "SLURM_NNODES": "2"}).endpoint == "gpu003:29400"


@pytest.mark.parametrize(("text", "counts"), [
    ("2", (2,)), ("2(x3)", (2, 2, 2)), ("2(x3),1", (2, 2, 2, 1)), ("4,1", (4, 1)),
    (" 1(x2), 3 ", (1, 1, 3)),
])
def test_slurm_task_layouts_as_slurm_writes_them(text: str, counts: tuple[int, ...]) -> None:
    assert slurm_tasks_per_node("SLURM_STEP_TASKS_PER_NODE", text) == counts


@pytest.mark.parametrize("text", ["", "2(x)", "x2", "2(x0)", "2,,1", "2(3)"])
def test_bad_slurm_task_layouts_name_the_variable(text: str) -> None:
    with pytest.raises(EnvError, match="SLURM_TASKS_PER_NODE=.*not a SLURM task layout"):
        slurm_tasks_per_node("SLURM_TASKS_PER_NODE", text)


@given(st.lists(st.integers(1, 64), min_size=1, max_size=40))
def test_slurm_task_layout_round_trips_slurms_compression(counts: list[int]) -> None:
    # SLURM writes runs of equal counts as N(xK): compress, then read back
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    assert slurm_tasks_per_node("SLURM_TASKS_PER_NODE", ",".join(parts)) == tuple(counts)
