"""HSDP's mesh shape and the errors of hsdp/offload options (no process group needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.strategies import STRATEGY_NAMES, get_strategy, taking
from splitsync.strategies.hsdp import mesh_shape


def test_mesh_shape_defaults_to_one_node_per_shard_group() -> None:
    assert mesh_shape(16, 8) == (2, 8)  # 2 nodes of 8: shard inside, replicate across
    assert mesh_shape(4, 4) == (1, 4)
    assert mesh_shape(4, None) == (1, 4)
    assert mesh_shape(4, 4, replicate=2) == (2, 2)
    assert mesh_shape(8, 8, shard=2) == (4, 2)
    assert mesh_shape(8, 8, replicate=2, shard=4) == (2, 4)
    assert mesh_shape(1, 1) == (1, 1)


def test_mesh_shape_errors_name_the_values_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"replicate=3 does not divide the world size 4 .*"
                       r"pass replicate= one of \[1, 2, 4\], or shard= instead"):
        mesh_shape(4, 4, replicate=3)
    with pytest.raises(ValueError, match=r"shard=3 does not divide the world size 6|"
                       r"shard=4 does not divide the world size 6 .*one of \[1, 2, 3, 6\]"):
        mesh_shape(6, 6, shard=4)
    with pytest.raises(ValueError, match=r"replicate=2 x shard=4 = 8, but the world size is 4"):
        mesh_shape(4, 4, replicate=2, shard=4)
    with pytest.raises(ValueError, match=r"the 3 processes of a node do not divide the world "
                       r"size 8.*one of \[1, 2, 4, 8\]"):
        mesh_shape(8, 3)
    with pytest.raises(ValueError, match=r"replicate=0: give a number of ranks >= 1"):
        mesh_shape(4, 4, replicate=0)
    with pytest.raises(ValueError, match=r"shard=True"):
        mesh_shape(4, 4, shard=True)


def test_hsdp_is_a_strategy_that_claims_before_fsdp() -> None:
    assert "hsdp" in STRATEGY_NAMES
    assert STRATEGY_NAMES.index("hsdp") < STRATEGY_NAMES.index("fsdp")  # for_model's order
    assert set(get_strategy("hsdp").options) >= {"replicate", "shard", "offload", "blocks"}
    assert taking("offload") == ["hsdp", "fsdp"]


def test_bad_hsdp_and_offload_options_fail_in_run_model() -> None:
    with ss.init(seed=0) as run:
        with pytest.raises(ValueError, match=r"replicate=3 does not divide the world size 1"):
            run.model(nn.Linear(2, 2), strategy="hsdp", replicate=3)
        with pytest.raises(TypeError, match=r"strategy 'ddp' does not take \['offload'\].*"
                           r"offload= is an option of strategy 'hsdp' or 'fsdp': pass "
                           r"strategy='fsdp'.*'ddp' keeps a whole replica on each device"):
            run.model(nn.Linear(2, 2), strategy="ddp", offload=True)
        with pytest.raises(TypeError, match=r"strategy 'single' does not take \['offload'\]"):
            run.model(nn.Linear(2, 2), offload=True)  # "auto" at one process
        with pytest.raises(TypeError, match=r"offload='yes': give True"):
            run.model(nn.Linear(2, 2), strategy="fsdp", offload="yes")
        with pytest.raises(TypeError, match=r"'fsdp' does not take \['replicate'\].*"
                           r"strategy='hsdp'"):
            run.model(nn.Linear(2, 2), strategy="fsdp", replicate=2)


def test_one_process_without_a_group_says_what_it_did_not_apply(
        capsys: pytest.CaptureFixture) -> None:
    with ss.init(seed=0) as run:
        model = run.model(nn.Linear(2, 2), strategy="hsdp", offload=True)
        assert isinstance(model, nn.Linear) and model.weight.device == run.device
        assert model(torch.ones(1, 2)).shape == (1, 2)
    err = capsys.readouterr().err
    assert "strategy='hsdp' in a single process" in err and "(offload not applied)" in err
