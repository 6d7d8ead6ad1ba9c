"""The strategy seam in one process: lookups, flags and the one state path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.strategies import for_model, get_strategy


def test_for_model_finds_the_wrapper_and_looks_through_compile() -> None:
    plain = nn.Linear(2, 2)
    assert for_model(plain).name == "single"
    assert for_model(torch.compile(plain, backend="eager")).name == "single"
    assert for_model(nn.DataParallel(plain)).name == "dp"


def test_flags_say_what_each_strategy_does() -> None:
    assert get_strategy("fsdp").replaces_parameters
    assert not get_strategy("ddp").replaces_parameters
    assert get_strategy("dp").places_module and not get_strategy("single").places_module


def test_run_remembers_the_strategy_of_each_model() -> None:
    with ss.init(seed=0) as run:
        model = run.model(nn.Linear(2, 2), strategy="single")
        assert run.strategy_of(model) is get_strategy("single")


@pytest.mark.parametrize("wrap", [lambda m: m, nn.DataParallel,
                                  lambda m: torch.compile(m, backend="eager")])
def test_one_state_path_round_trips_by_parameter_name(wrap) -> None:
    from splitsync.ckpt.state import (
        check_optimizer_names,
        load_model_state,
        load_optimizer_state,
        model_state,
        optimizer_state,
        state_shapes,
    )

    src, dst = nn.Linear(3, 2), nn.Linear(3, 2)
    opt_src = torch.optim.Adam(src.parameters())
    src(torch.randn(1, 3)).sum().backward()
    opt_src.step()
    wsrc, wdst = wrap(src), wrap(dst)
    sd = model_state(wsrc, full=True, offload=True)
    assert sd.keys() == {"weight", "bias"}  # no wrapper prefixes
    assert sd["weight"].data_ptr() == src.weight.data_ptr()  # a view of CPU state, no copy
    load_model_state(wdst, sd, full=True)
    assert torch.equal(dst.weight, src.weight)
    assert state_shapes(wdst) == {"weight": (2, 3), "bias": (2,)}
    opt_dst = torch.optim.Adam(dst.parameters())
    saved = optimizer_state(wsrc, opt_src, full=True, offload=True)
    assert set(saved["state"]) == {"weight", "bias"}
    assert optimizer_state(wdst, opt_dst, full=True, offload=True)["state"] == {}
    assert not opt_dst.state  # not stepped to make a state (DCP would take a step)
    check_optimizer_names(wdst, opt_dst, saved)
    load_optimizer_state(wdst, opt_dst, saved, full=True)
    assert torch.equal(opt_dst.state_dict()["state"][0]["exp_avg"],
                       opt_src.state_dict()["state"][0]["exp_avg"])
    with pytest.raises(ss.CheckpointError, match="names parameter 'nope'"):
        check_optimizer_names(wdst, opt_dst, {"state": {"nope": {}}, "param_groups": []})


def test_walker_keeps_container_types() -> None:
    import collections
    import dataclasses

    from splitsync.distributed.device import move_to
    from splitsync.tree import iter_tensors

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        meta: str = "m"

    pair = collections.namedtuple("pair", "a b")
    batch = {"p": pair(torch.zeros(1), [torch.ones(2)]), "d": Batch(torch.zeros(3)),
             "o": collections.OrderedDict(k=torch.zeros(1))}
    moved = move_to(batch, "cpu")
    assert type(moved["p"]) is pair and type(moved["d"]) is Batch
    assert type(moved["o"]) is collections.OrderedDict and moved["d"].meta == "m"
    names = [n for n, _ in iter_tensors(batch, "input")]
    assert names == ["input['d'].x", "input['o']['k']", "input['p'][0]", "input['p'][1][0]"]
