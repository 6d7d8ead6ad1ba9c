"""SS215 a TP plan naming a module the model lacks, SS216 a loss not reduced over the TP
group: each from a real idiom (torchtitan's Llama plan, splitsync's run.model(tp_plan=)),
with its silent twin."""

from __future__ import annotations

import textwrap

from splitsync.check import check_source, select_rules

MODEL = """
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    class Attention(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.wq = nn.Linear(dim, dim)
            self.wo = nn.Linear(dim, dim)

    class FeedForward(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.w1, self.w2 = (nn.Linear(a, b) for a, b in ((dim, 4 * dim), (4 * dim, dim)))

    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.attention, self.feed_forward = Attention(dim), FeedForward(dim)

    class Transformer(nn.Module):
        def __init__(self, dim, n):
            super().__init__()
            self.tok_embeddings = nn.Embedding(100, dim)
            self.layers = nn.ModuleList([Block(dim) for _ in range(n)])
            self.output = nn.Linear(dim, 100)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens)
            for layer in self.layers:
                h = layer(h)
            return self.output(h)
"""


def run(code: str, body: str) -> list:
    source = textwrap.dedent(MODEL) + textwrap.dedent(body)
    return check_source(source, "case.py", select_rules([code], gated=False))


def test_ss215_flags_a_plan_key_the_model_does_not_have() -> None:
    found = run("SS215", """
        mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
        model = Transformer(64, 2)
        plan = {
            "layers.*.attention.wq": ColwiseParallel(),
            "layers.*.attn.wo": RowwiseParallel(),
            "layers.*.feed_forward.w3": ColwiseParallel(),
            "output": ColwiseParallel(output_layouts=Replicate()),
        }
        parallelize_module(model, mesh["tp"], plan)
    """)
    assert [f.message.split("`")[3] for f in found] == ["layers.*.attn.wo",
                                                        "layers.*.feed_forward.w3"]
    assert "`attn` is no submodule" in found[0].message
    assert "named_modules" in found[0].fix


def test_ss215_flags_run_model_tp_plan() -> None:
    found = run("SS215", """
        import splitsync
        run = splitsync.init(mesh={"dp_shard": -1, "tp": 2})
        model = run.model(Transformer(64, 2), tp_plan={"layers.0.feed_forward.w9": ColwiseParallel()})

        def plan():
            return {"layers.*.attention.wk": ColwiseParallel()}

        other = run.model(Transformer(64, 2), tp_plan=plan())
    """)
    assert len(found) == 2 and "`w9` is no submodule" in found[0].message
    assert "`wk` is no submodule" in found[1].message


def test_ss215_silent_on_a_right_plan_and_on_a_class_it_cannot_see() -> None:
    assert run("SS215", """
        import splitsync
        from transformers import AutoModelForCausalLM
        run = splitsync.init(mesh={"dp_shard": -1, "tp": 2})
        model = Transformer(64, 2)
        plan = {
            "layers.*.attention.wq": ColwiseParallel(),
            "layers.*.attention.wo": RowwiseParallel(),
            "layers.1.feed_forward.w*": ColwiseParallel(),
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        }
        model = run.model(model, tp_plan=plan)
        hf = AutoModelForCausalLM.from_pretrained("x")
        parallelize_module(hf, mesh, {"model.layers.*.self_attn.q_proj": ColwiseParallel()})

        class Dynamic(nn.Module):
            def __init__(self):
                super().__init__()
                for i in range(3):
                    self.add_module(f"fc{i}", nn.Linear(2, 2))

        parallelize_module(Dynamic(), mesh, {"fc0": ColwiseParallel()})
    """) == []


def test_ss216_flags_a_colwise_output_layer_handing_its_local_shard_to_the_loss() -> None:
    found = run("SS216", """
        mesh = init_device_mesh("cuda", (4,), mesh_dim_names=("tp",))
        model = Transformer(64, 2)
        parallelize_module(model, mesh, {"layers.*.attention.wq": ColwiseParallel(),
                                         "output": ColwiseParallel()})
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    """)
    assert len(found) == 1 and "`output` is the model's output layer" in found[0].message
    assert "loss_parallel" in found[0].fix and "Replicate()" in found[0].fix


def test_ss216_silent_on_replicated_or_loss_parallel_outputs() -> None:
    assert run("SS216", """
        mesh = init_device_mesh("cuda", (4,), mesh_dim_names=("tp",))
        model = Transformer(64, 2)
        parallelize_module(model, mesh, {"layers.*.attention.wq": ColwiseParallel(),
                                         "output": ColwiseParallel(output_layouts=Replicate())})
        other = Transformer(64, 2)
        parallelize_module(other, mesh, {
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                      use_local_output=False)})
    """) == []


def test_ss216_flags_a_sum_over_the_world_on_a_tp_mesh() -> None:
    found = run("SS216", """
        import torch.distributed as dist
        import splitsync
        run = splitsync.init(mesh={"dp_shard": -1, "tp": 2})
        tokens = torch.tensor(float(batch.numel()))
        dist.all_reduce(tokens)
    """)
    assert len(found) == 1 and "tp times" in found[0].message
    assert 'mesh["dp"]' in found[0].fix


def test_ss216_silent_on_a_dp_group_an_average_or_no_tp_mesh() -> None:
    assert run("SS216", """
        import torch.distributed as dist
        import splitsync
        run = splitsync.init(mesh={"dp_shard": -1, "tp": 2})
        dist.all_reduce(tokens, group=run.mesh["dp_shard"].get_group())
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        dist.all_reduce(total)
        mean = total / dist.get_world_size()
    """) == []
    assert run("SS216", """
        import torch.distributed as dist
        dist.init_process_group("gloo")
        dist.all_reduce(tokens)
    """) == []
