"""init(mesh=...)'s sizes: -1 filled in, impossible shapes refused with the numbers, and each
rank's data-parallel and tensor-parallel coordinates under every launcher's variables."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.distributed.env import detect_env
from splitsync.distributed.mesh import MeshShape, mesh_shape, tp_spans_nodes


def test_the_rest_is_filled_in() -> None:
    shape = mesh_shape({"dp_replicate": 1, "dp_shard": -1, "tp": 2}, 8)
    assert shape == MeshShape(1, 4, 2)
    assert (shape.dp_size, shape.world_size) == (4, 8)
    assert mesh_shape({"tp": 4}, 4) == MeshShape(1, 1, 4)
    assert mesh_shape({"dp_replicate": 2, "dp_shard": 2, "tp": -1}, 8) == MeshShape(2, 2, 2)


@pytest.mark.parametrize(("mesh", "world", "fragments"), [
    ({"dp_shard": -1, "tp": 3}, 4, ["tp=3", "does not divide the world size 4"]),
    ({"dp_shard": 2, "tp": 2}, 8, ["dp_shard=2 x tp=2", "= 4 ranks", "world size is 8"]),
    ({"dp_shard": -1, "tp": -1}, 4, ["dp_shard and tp are both -1"]),
    ({"dp_shard": 0}, 4, ["dp_shard=0", ">= 1"]),
    ({"tp": 2.0}, 4, ["tp=2.0"]),
    ({"tensor": 2}, 4, ["unknown dimension 'tensor'", "dp_replicate, dp_shard, tp"]),
    ({"dp_shards": -1}, 4, ["Did you mean 'dp_shard'?"]),
])
def test_impossible_shapes_are_refused_with_the_numbers(mesh: dict[str, Any], world: int,
                                                        fragments: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        mesh_shape(mesh, world)
    for f in fragments:
        assert f in str(err.value)


LAUNCHERS = {
    "torchrun": {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "x"},
    "slurm": {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
              "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[003-004]",
              "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0",
              "SLURM_STEP_TASKS_PER_NODE": "4(x2)"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                "PMIX_NAMESPACE": "1", "MASTER_ADDR": "node0"},
    "mpich": {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4",
              "MASTER_PORT": "29510"},
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_coordinates_under_every_launcher(launcher: str) -> None:
    env = detect_env(LAUNCHERS[launcher])
    assert env.launcher == launcher
    # rank 5 of 8 = (replica 1, shard 0, tp 1) on a (2, 2, 2) mesh: tp innermost
    shape = mesh_shape({"dp_replicate": 2, "dp_shard": 2, "tp": -1}, env.world_size)
    assert (shape.dp_rank(env.rank), shape.tp_rank(env.rank)) == (2, 1)
    shape = mesh_shape({"dp_shard": -1, "tp": 4}, env.world_size)
    assert (shape.dp_rank(env.rank), shape.tp_rank(env.rank), shape.dp_size) == (1, 1, 2)
    assert not tp_spans_nodes(shape, env.local_world_size)  # 4 per node: a TP group each
    assert tp_spans_nodes(mesh_shape({"tp": 8}, 8), env.local_world_size)


def test_one_process_with_a_mesh_of_ones() -> None:
    with ss.init(seed=0, mesh={"dp_shard": -1, "tp": 1}) as run:
        assert (run.mesh, run.dp_rank, run.dp_size, run.tp_rank, run.tp_size) == (None, 0, 1,
                                                                                  0, 1)
        model = run.model(Two(), tp_plan={"up": "colwise", "down": "rowwise"})
        assert run.strategy_of(model).name == "tp"
        assert isinstance(model.up.weight, nn.Parameter)  # one process: whole, not split
    with pytest.raises(ValueError, match="tp=2.*world size is 1"):
        ss.init(seed=0, mesh={"dp_shard": 1, "tp": 2})


def test_no_mesh_means_every_rank_a_replica() -> None:
    with ss.init(seed=0) as run:
        assert (run.mesh, run.dp_rank, run.dp_size, run.tp_rank, run.tp_size) == (None, 0, 1,
                                                                                  0, 1)
        with pytest.raises(ValueError, match="tp_plan=.*pass init\\(mesh="):
            run.model(Two(), tp_plan={"up": "colwise"})


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"strategy": "ddp", "mesh": {"tp": 1}}, "drop strategy='ddp'"),
    ({"strategy": "tp"}, "strategy='tp' lays the model out on init\\(mesh"),
])
def test_init_refuses_what_a_mesh_cannot_combine_with(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ss.init(seed=0, **kwargs)


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)


def test_a_plan_naming_a_missing_module_is_refused() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel

    from splitsync.strategies.tp import resolve_plan

    with pytest.raises(ValueError, match="names 'upp'.*Did you mean 'up'"):
        resolve_plan(Two(), {"upp": ColwiseParallel()})
    with pytest.raises(ValueError, match="'diagonal', a style splitsync does not map"):
        resolve_plan(Two(), {"up": "diagonal"})
    with pytest.raises(TypeError, match="give a PyTorch ParallelStyle"):
        resolve_plan(Two(), {"up": torch.nn.Linear})
    with pytest.raises(ValueError, match="has none; pass a plan of your own"):
        resolve_plan(Two(), "auto")
    assert set(resolve_plan(Two(), {"up": "colwise", "down": "rowwise"})) == {"up", "down"}


def test_the_auto_plan_of_a_hugging_face_model_is_keyed_from_the_model() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from transformers import LlamaConfig, LlamaForCausalLM

    from splitsync.strategies.tp import resolve_plan

    config = LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    plan = resolve_plan(LlamaForCausalLM(config), "auto")
    assert isinstance(plan["model.layers.*.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(plan["model.layers.*.mlp.down_proj"], RowwiseParallel)
